"""Groups from pairs, without chains: complete linkage, and the member suggested to keep.

A group is a clique: every two members of it are a pair (at most the threshold apart), so a chain
A~B, B~C with A≁C never puts A and C together, and each member's score against the keeper is above
the threshold too. Built greedily, strongest pair first: two groups merge only when every member of
one pairs with every member of the other and the result holds at most `max_size` members. A pair the
search did not return counts as "not similar" (never as similar), so a missed pair can split a group,
never join two.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from indexer.domain.records import ItemRecord

Pair = tuple[int, int]  # smaller id first


def complete_linkage(
    pairs: Mapping[Pair, float], max_size: int, leave_out: Container[int] = frozenset()
) -> list[list[int]]:
    """Groups (sorted ids, at least two each) of the ids in `pairs` (pair -> strength, higher first),
    ignoring ids in `leave_out`."""
    group_of: dict[int, int] = {}  # id -> the id naming its group
    members: dict[int, list[int]] = {}
    failed: set[Pair] = set()  # group pairs that cannot merge: supersets of them cannot either
    for (a, b), _ in sorted(pairs.items(), key=lambda item: (-item[1], item[0])):
        if a in leave_out or b in leave_out:
            continue
        ga, gb = group_of.get(a, a), group_of.get(b, b)
        if ga == gb or (min(ga, gb), max(ga, gb)) in failed:
            continue
        ma, mb = members.get(ga, [a]), members.get(gb, [b])
        if len(ma) + len(mb) > max_size or not all(
            (min(x, y), max(x, y)) in pairs for x in ma for y in mb if (x, y) != (a, b)
        ):
            failed.add((min(ga, gb), max(ga, gb)))
            continue
        if len(ma) < len(mb):
            ga, gb, ma, mb = gb, ga, mb, ma
        merged = ma + mb
        members[ga] = merged
        members.pop(gb, None)
        for x in merged:
            group_of[x] = ga
    return [sorted(group) for group in members.values()]


def richness(item: ItemRecord) -> int:
    """How much a user told or the camera recorded about a picture: an EXIF date, a caption, tags, extra."""
    return (item.taken_source == "exif") + bool(item.caption) + bool(item.tags) + bool(item.extra)


def keeper_order(item: ItemRecord) -> tuple[int, int, int, int]:
    """Sort key from the catalog's records alone: most pixels, then most bytes, then the richest
    metadata, then the oldest item. Orders a group's ids while it is built; the keeper a page shows
    is chosen from the members' bytes (indexer/service/keeper.py)."""
    pixels = (item.width or 0) * (item.height or 0)
    return (-pixels, -(item.size or 0), -richness(item), item.id)


def group_order(group: list[int]) -> tuple[int, int]:
    """Largest groups first, then by their smallest id: a stable order for pages."""
    return (-len(group), min(group))
