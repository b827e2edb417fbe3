"""Where relevance starts, per model: a suggested `min_score` for text → image and image → image.

Cosine scores are not comparable across models (a contrastive model's matching text-image pairs
sit far lower than matching image pairs), so a cutoff must be chosen per model and query kind.
These are starting points the web UI offers (and a user may change), measured as follows:
- cnclip-demo: on the demo gallery (`cnclip demo`, 300 pictures), 30 "<colour>的<shape>" queries,
  a result counted right when its caption has both. text 0.25: precision 0.53, recall 0.58 (0.30:
  0.87 / 0.55; 0.20: 0.27 / 0.68), ~8 results a query. image 0.6 (same shape and colour as the query
  picture): precision 0.42, recall 0.30; this toy model's image vectors weigh count and background
  as much as shape.
- Chinese-CLIP (`cnclip convert`'s default names, cnclip-<arch>): not measured here (no weights
  offline). Matching text-image pairs of contrastive CLIP models sit around 0.3–0.5 and unrelated
  ones 0.1–0.25, so 0.3 / 0.7 are guesses, to be re-measured with `demo/evaluate.py`-style queries
  on real photos.
An unknown model gets no suggestion: the UI then shows every result until the user sets a cutoff.

Where "similar shots" start (`cnclip duplicates`, the third tier: image-image cosine to the group's
keeper at least this) when a collection has no calibration of its own (indexer/service/duplicate_calibration.py
measures one per collection with its model; this is the fallback of a process without that model, and
of collections too small to measure), per model, as `duplicate_threshold(model_id)`:
- cnclip-demo: 0.88, measured by `python -m demo.duplicate_threshold` on the demo gallery (300 scenes):
  the lowest cosine at which at most 5 % of pairs of different scenes (shape, colour, background or
  texture changed) pass; another shot of the same scene passes at 0.877 (docs/duplicates.md).
- every other model, Chinese-CLIP checkpoints included: 0.95, NOT measured (no real photos or weights
  offline here). Bursts of one scene with released CLIP models sit around 0.92-0.98 and different
  photos of one kind of scene lower; 0.95 leans to fewer false groups. CNCLIP_DUPLICATE_THRESHOLD
  overrides it; measure it on your own photos.
"""

from __future__ import annotations

from typing import Literal

QueryKind = Literal["text", "image"]

_CHINESE_CLIP: dict[QueryKind, float] = {"text": 0.3, "image": 0.7}
SUGGESTED: dict[str, dict[QueryKind, float]] = {
    "cnclip-demo": {"text": 0.25, "image": 0.6},
    **{f"cnclip-{arch}": _CHINESE_CLIP for arch in ("vit-b-16", "vit-l-14", "vit-l-14-336", "vit-h-14", "rn50")},
}


def suggested_min_scores(model_id: str) -> dict[QueryKind, float]:
    """The suggested cutoffs for a model id ("name@fingerprint" or a bare name); {} when unknown."""
    name = model_id.split("@", 1)[0].lower()
    return dict(SUGGESTED.get(name, {}))


_DUPLICATE_MEASURED: dict[str, float] = {"cnclip-demo": 0.88}
DUPLICATE_UNMEASURED = 0.95


def duplicate_threshold(model_id: str) -> tuple[float, bool]:
    """(cosine where similar shots start, whether it was measured for this model)."""
    name = model_id.split("@", 1)[0].lower()
    if name in _DUPLICATE_MEASURED:
        return _DUPLICATE_MEASURED[name], True
    return DUPLICATE_UNMEASURED, False
