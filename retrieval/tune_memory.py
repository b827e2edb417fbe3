"""The tuner's choice within the memory budget (retrieval/memory_budget.py).

Two levers, in this order: a tower whose fastest backend holds a weight copy per session (OpenVINO:
one per batch bucket and text length) while even the shared copies would not fit moves to its fastest
backend that shares one copy; then prepacked shapes are dropped, the smallest measured gain first.
"""

from __future__ import annotations

from collections.abc import Callable

from retrieval.gate import Candidate
from retrieval.memory_budget import Budget
from retrieval.tuning import Shape, ShapeChoice, TowerChoice

Winner = tuple[Candidate, dict[Shape, ShapeChoice]]


def least_mb(candidate: Candidate, shapes: int, copy_mb: float) -> float:
    """The fewest MB a tower's weights can take on `candidate`: one copy if it shares, else one per shape."""
    return copy_mb if candidate.backend.shares_weights(candidate.device) else shapes * copy_mb


def fit_towers(
    winners: dict[str, Winner],
    sharing: Callable[[str], Winner | None],
    copy_mb_of: Callable[[str, Candidate], float],
    budget: Budget,
) -> tuple[dict[str, Winner], list[str]]:
    """Move towers to a weight-sharing backend, the largest holder first, until the least they can
    take fits the budget; notes say what moved and why."""
    winners, notes = dict(winners), []

    def need(tower: str, winner: Winner) -> float:
        return least_mb(winner[0], len(winner[1]), copy_mb_of(tower, winner[0]))

    for tower in sorted(winners, key=lambda t: -need(t, winners[t])):
        total = sum(need(t, w) for t, w in winners.items())
        if budget.allows(total) or winners[tower][0].backend.shares_weights(winners[tower][0].device):
            continue
        fallback = sharing(tower)
        if fallback is None:
            continue
        notes.append(
            f"{winners[tower][0].label} {tower}: its sessions would hold {need(tower, winners[tower]):.0f} MB of "
            f"weight copies, over the memory budget ({budget.source}); {fallback[0].label} shares one copy instead"
        )
        winners[tower] = fallback
    return winners, notes


def fit_prepacks(choices: dict[str, TowerChoice], copy_mb: dict[str, float], budget: Budget) -> dict[str, TowerChoice]:
    """Drop prepacked shapes, the smallest gain first, until the weight copies fit the budget."""

    def total() -> float:
        mb = 0.0
        for tower, choice in choices.items():
            shared = any(not v.prepack for v in choice.shapes.values()) or not choice.shapes
            own = sum(v.prepack for v in choice.shapes.values())
            mb += copy_mb[tower] * ((1 if shared else 0) + choice.streams * own)
        return mb

    ranked = sorted(
        ((v.prepack_gain or 1.0, t, k) for t, c in choices.items() for k, v in c.shapes.items() if v.prepack),
        key=lambda item: item[0],
    )
    for _gain, tower, key in ranked:
        if budget.allows(total()):
            break
        shapes = dict(choices[tower].shapes)
        shapes[key] = shapes[key].model_copy(update={"prepack": False})
        choices[tower] = choices[tower].model_copy(update={"shapes": shapes})
    return choices
