"""What a request for near-duplicate groups may ask (indexer/service/duplicates.py): the tiers, page bounds and
the threshold's range. Apart from it (no FAISS, no SQL) so that the CLI's options stay instant."""

from __future__ import annotations

from typing import Literal

from retrieval.errors import InvalidInput

Tier = Literal["identical", "resized", "similar"]
TierChoice = Literal["all", "identical", "resized", "similar"]
TIERS: tuple[Tier, ...] = ("identical", "resized", "similar")
TIER_CHOICES: tuple[TierChoice, ...] = ("all", *TIERS)
MAX_LIMIT = 100  # groups per page
MAX_OFFSET = 1_000_000
MIN_THRESHOLD = 0.5  # below, "similar shots" means little and the pairs outgrow memory
MAX_BUDGET_S = 3600.0


def check_page(tier: str, offset: int, limit: int, budget_s: float | None, threshold: float | None) -> None:
    """`InvalidInput` for a request no answer can give (the API validates first; the CLI relies on this)."""
    if tier not in TIER_CHOICES:
        raise InvalidInput(f"tier is one of {', '.join(TIER_CHOICES)}, not {tier!r}")
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidInput(f"offset must be 0 to {MAX_OFFSET}, not {offset}")
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1 to {MAX_LIMIT} groups, not {limit}")
    if budget_s is not None and not 0 < budget_s <= MAX_BUDGET_S:
        raise InvalidInput(f"the time budget must be above 0 and at most {MAX_BUDGET_S:g} s, not {budget_s}")
    if threshold is not None and not MIN_THRESHOLD <= threshold <= 1.0:
        raise InvalidInput(f"the threshold is a cosine similarity, {MIN_THRESHOLD} to 1, not {threshold}")
