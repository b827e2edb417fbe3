"""Held-out quality of a converted model directory, measured with ONNX Runtime (the serving path).

    python -m demo.evaluate --model-dir models/cnclip-demo --gallery 500

The gallery holds pictures of held-out (shape, colour, background) combinations; every query and
every caption of the text corpus comes from held-out templates. A result is a hit when its
attributes match every attribute the query names (many pictures share one description):

- text → image R@1 / R@5: one held-out caption per gallery picture, ranked over the gallery;
- image → text R@1: each picture against the corpus of all held-out captions of the gallery;
- zero-shot shape / colour accuracy: labels through the prompt template "一张{}的照片";
- int8 top-10 overlap: the share of fp32's top-10 pictures per query that int8 also returns.

Images go through `retrieval.preprocess.normalise` and texts through `retrieval.tokenizer`, the
same code the service runs.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from demo import dataset, vocabulary
from retrieval.config import SHIPPED_MODEL_DIR
from retrieval.manifest import ModelManifest
from retrieval.preprocess import normalise
from retrieval.tokenizer import tokenize

ZERO_SHOT_TEMPLATE = "一张{}的照片"
GALLERY_SEED = 1
QUERY_SEED = 5


class OnnxTowers:
    """Both towers of one precision, each run at its largest bucket (the last batch zero-padded)."""

    def __init__(self, model_dir: Path, precision: str = "fp32", threads: int = 2) -> None:
        import onnxruntime as ort

        self.manifest = ModelManifest.load(model_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.sessions = {}
        for tower in ("image", "text"):
            spec = self.manifest.towers[tower]
            bucket = max(spec.buckets(precision))
            path = self.manifest.graph_path(tower, precision, bucket)
            session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
            self.sessions[tower] = (session, bucket, spec.input_name, spec.output_name)

    def _run(self, tower: str, inputs: np.ndarray) -> np.ndarray:
        session, bucket, input_name, output_name = self.sessions[tower]
        out = []
        for start in range(0, len(inputs), bucket):
            chunk = inputs[start : start + bucket]
            padded = np.zeros((bucket, *chunk.shape[1:]), dtype=chunk.dtype)
            padded[: len(chunk)] = chunk
            out.append(session.run([output_name], {input_name: padded})[0][: len(chunk)])
        return np.concatenate(out).astype(np.float32)

    def images(self, images: list) -> np.ndarray:
        m = self.manifest
        pixels = np.stack([normalise(im, m.image_size, m.mean, m.std) for im in images])
        return self._run("image", pixels)

    def texts(self, texts: list[str]) -> np.ndarray:
        return self._run("text", tokenize(texts, self.manifest.context_length))


@dataclass
class Benchmark:
    """The held-out gallery, its queries and its caption corpus."""

    gallery: list[dataset.Sample]
    queries: list[dataset.Caption]
    corpus: list[dataset.Caption]

    @classmethod
    def build(cls, n: int = 500) -> Benchmark:
        gallery = dataset.samples("heldout", n, seed=GALLERY_SEED)
        rng = random.Random(QUERY_SEED)
        queries = [dataset.caption(s.attributes, rng, dataset.HELDOUT_TEMPLATES) for s in gallery]
        corpus: dict[str, dataset.Caption] = {}
        for s in gallery:
            for t in dataset.usable(dataset.HELDOUT_TEMPLATES, s.attributes):
                c = dataset.fill(t, s.attributes, rng)
                corpus.setdefault(c.text, c)
        return cls(gallery, queries, list(corpus.values()))


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def retrieval_metrics(bench: Benchmark, img: np.ndarray, qry: np.ndarray, cor: np.ndarray) -> dict[str, float]:
    attrs = [s.attributes for s in bench.gallery]
    top5 = _topk(qry @ img.T, 5)
    hits = [[attrs[j].matches(q.named) for j in row] for q, row in zip(bench.queries, top5, strict=True)]
    best_text = (img @ cor.T).argmax(1)
    i2t = [a.matches(bench.corpus[j].named) for a, j in zip(attrs, best_text, strict=True)]
    return {
        "t2i_r1": float(np.mean([h[0] for h in hits])),
        "t2i_r5": float(np.mean([any(h) for h in hits])),
        "i2t_r1": float(np.mean(i2t)),
    }


def zero_shot_accuracy(bench: Benchmark, towers: OnnxTowers, img: np.ndarray) -> dict[str, float]:
    out = {}
    for name, labels, key in (
        ("shape", list(vocabulary.SHAPES), "shape"),
        ("colour", list(vocabulary.COLOURS), "colour"),
    ):
        label_vecs = towers.texts([ZERO_SHOT_TEMPLATE.format(label) for label in labels])
        predicted = (img @ label_vecs.T).argmax(1)
        truth = [getattr(s.attributes, key) for s in bench.gallery]
        out[f"zeroshot_{name}_acc"] = float(np.mean([labels[p] == t for p, t in zip(predicted, truth, strict=True)]))
    return out


def evaluate(
    model_dir: Path, n: int = 500, precisions: tuple[str, ...] = ("fp32", "int8")
) -> dict[str, dict[str, float]]:
    """Every metric per precision, plus `int8.top10_overlap` against fp32 when both are asked for."""
    bench = Benchmark.build(n)
    images = [s.image() for s in bench.gallery]
    results: dict[str, dict[str, float]] = {}
    rankings: dict[str, np.ndarray] = {}
    for precision in precisions:
        towers = OnnxTowers(model_dir, precision)
        img = towers.images(images)
        qry = towers.texts([q.text for q in bench.queries])
        cor = towers.texts([c.text for c in bench.corpus])
        results[precision] = {**retrieval_metrics(bench, img, qry, cor), **zero_shot_accuracy(bench, towers, img)}
        rankings[precision] = _topk(qry @ img.T, 10)
    if "fp32" in rankings and "int8" in rankings:
        overlap = [len(set(a) & set(b)) / 10 for a, b in zip(rankings["fp32"], rankings["int8"], strict=True)]
        results["int8"]["top10_overlap_vs_fp32"] = float(np.mean(overlap))
    results["_benchmark"] = {"gallery": len(bench.gallery), "queries": len(bench.queries), "corpus": len(bench.corpus)}
    return results


def markdown(results: dict[str, dict[str, float]]) -> str:
    """The metrics as the model card's table."""
    names = [p for p in results if not p.startswith("_")]
    keys = [k for k in results[names[0]]]
    rows = ["| metric | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for k in [*keys, "top10_overlap_vs_fp32"]:
        if any(k in results[p] for p in names):
            rows.append(
                f"| {k} | " + " | ".join(f"{results[p][k]:.3f}" if k in results[p] else "–" for p in names) + " |"
            )
    return "\n".join(rows)


CARD_START = "<!-- metrics:start (written by python -m demo.evaluate --card) -->"
CARD_END = "<!-- metrics:end -->"


def write_card_metrics(model_dir: Path, results: dict[str, dict[str, float]]) -> None:
    """Record `results` in MODEL_DIR/eval.json and between the metric markers of MODEL_CARD.md."""
    (model_dir / "eval.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    card_path = model_dir / "MODEL_CARD.md"
    card = card_path.read_text(encoding="utf-8")
    if CARD_START not in card or CARD_END not in card:
        raise SystemExit(f"{card_path} has no metric markers")
    head, rest = card.split(CARD_START, 1)
    _, tail = rest.split(CARD_END, 1)
    b = results["_benchmark"]
    table = (
        f"{markdown(results)}\n\n{b['gallery']} held-out pictures, {b['queries']} held-out queries, "
        f"{b['corpus']} held-out captions in the image → text corpus."
    )
    card_path.write_text(f"{head}{CARD_START}\n{table}\n{CARD_END}{tail}", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=SHIPPED_MODEL_DIR)
    p.add_argument("--gallery", type=int, default=500, help="held-out gallery size")
    p.add_argument("--precision", default="fp32,int8", help="comma-separated precisions to evaluate")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--card", action="store_true", help="write eval.json and the metrics table of MODEL_CARD.md")
    args = p.parse_args()
    results = evaluate(args.model_dir, args.gallery, tuple(args.precision.split(",")))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if args.card:
        write_card_metrics(args.model_dir, results)
    print(markdown(results))
    b = results["_benchmark"]
    print(f"\n{b['gallery']} held-out pictures, {b['queries']} queries, {b['corpus']} corpus captions")


if __name__ == "__main__":
    main()
