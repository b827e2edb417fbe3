"""How a tower's bucket graphs differ, as recipes an engine can rebuild from the input's shape.

`cnclip convert` exports every bucket at its own batch size (and text length) and folds all shape
arithmetic into constants (retrieval/toolchain/convert/export.py): a bucket graph's Reshape targets
say `[8, 52, 12, 64]`, the class token is stored already broadcast to `[8, 1, 768]` and the position
embeddings already cut to 52 rows. The graphs of a tower are otherwise the same graph. Comparing
their constants position by position says which follow the input's shape, and how — the one rule
both shape-dynamic rewrites use (OpenVINO: retrieval/backends/openvino_batch.py; ONNX Runtime:
retrieval/backends/ort_batch.py). Only these forms are recognised, and only where every graph agrees
with them exactly:

- `ShapeVector`: an integer vector whose entries are constants or `k × batch`, `k × length`,
  `k × batch × length` (Reshape targets);
- `Sliced`: a tensor with an axis as long as an input dimension, whose slices along it are all the
  same (stored broadcast to the batch: keep one slice, broadcast at run time) or each graph's a
  prefix of the longest's (position embeddings: cut at run time).

Anything else is for the caller to refuse (`NotBatchLinear`) or to keep as the base graph has it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Shape = tuple[int, ...]


class NotBatchLinear(ValueError):
    """The bucket graphs differ in a way that is not a function of the input's shape alone."""


@dataclass(frozen=True)
class Term:
    """`k` × the product of the input dimensions `factors`."""

    k: int
    factors: tuple[int, ...]


@dataclass(frozen=True)
class ShapeVector:
    """An integer vector of runs of constants and `Term`s, in order; `dtype` its element type."""

    parts: tuple[tuple[int, ...] | Term, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Sliced:
    """`source` (the base's constant, broadcast axes kept at length 1), cut along `cut` and broadcast
    along `broadcast` to the input dimensions `follows` maps those axes to; `shape` is the base's."""

    source: np.ndarray
    follows: dict[int, int]  # constant axis -> the input axis it is as long as
    broadcast: tuple[int, ...]
    cut: tuple[int, ...]
    shape: Shape


@dataclass(frozen=True)
class Buckets:
    """The input shapes of a tower's graphs: the axes that vary and the base graph's shape (the
    smallest batch at the largest other dimensions: every other graph's constants are cut from it)."""

    shapes: tuple[Shape, ...]
    axes: tuple[int, ...]
    base: Shape

    @classmethod
    def of(cls, shapes: Sequence[Shape]) -> Buckets:
        if len(shapes) < 2:
            raise NotBatchLinear("one bucket graph says nothing about how the others differ")
        if len({len(s) for s in shapes}) != 1:
            raise NotBatchLinear("only single-input graphs of one rank are rewritten")
        axes = tuple(a for a in range(len(shapes[0])) if len({s[a] for s in shapes}) > 1)
        base = min(shapes, key=lambda s: (tuple(-s[a] for a in axes if a), s[0]))
        return cls(tuple(shapes), axes, base)

    def bounds(self) -> list[tuple[int, int]]:
        """Each input axis's (least, most) over the graphs (equal where it does not vary)."""
        return [(min(s[a] for s in self.shapes), max(s[a] for s in self.shapes)) for a in range(len(self.base))]

    def recipe(self, values: Mapping[Shape, np.ndarray]) -> ShapeVector | Sliced | None:
        """How one constant (its value in each graph) follows the input's shape; None: it does not."""
        return self._shape_vector(values) or self._sliced(values)

    def _shape_vector(self, values: Mapping[Shape, np.ndarray]) -> ShapeVector | None:
        """Entries that are equal everywhere stay; the others must be `k × Π dims` in every graph."""
        first = values[self.base]
        if first.ndim != 1 or first.dtype.kind not in "iu" or any(v.shape != first.shape for v in values.values()):
            return None
        parts: list[tuple[int, ...] | Term] = []
        constants: list[int] = []
        for j in range(first.shape[0]):
            entries = {s: int(v[j]) for s, v in values.items()}
            if len(set(entries.values())) == 1:
                constants.append(entries[self.base])
                continue
            term = self._term(entries)
            if term is None:
                return None
            if constants:
                parts.append(tuple(constants))
                constants = []
            parts.append(term)
        if constants:
            parts.append(tuple(constants))
        return ShapeVector(tuple(parts), first.dtype)

    def _term(self, entries: Mapping[Shape, int]) -> Term | None:
        # Products of the varying dimensions an entry may be a multiple of, fewest factors first.
        for n in range(1, len(self.axes) + 1):
            for factors in itertools.combinations(self.axes, n):
                per = {s: int(np.prod([s[a] for a in factors])) for s in entries}
                if all(e % per[s] == 0 for s, e in entries.items()):
                    ks = {e // per[s] for s, e in entries.items()}
                    if len(ks) == 1:
                        return Term(ks.pop(), factors)
        return None

    def _sliced(self, values: Mapping[Shape, np.ndarray]) -> Sliced | None:
        """Axes as long as an input dimension: slices all equal (broadcast them) or prefixes of the base's (cut)."""
        base = values[self.base]
        if base.ndim == 0 or any(v.ndim != base.ndim for v in values.values()):
            return None
        follows: dict[int, int] = {}
        for i in range(base.ndim):
            sizes = {s: v.shape[i] for s, v in values.items()}
            if len(set(sizes.values())) == 1:
                continue
            matching = [a for a in self.axes if all(sizes[s] == s[a] for s in sizes)]
            if not matching:
                return None
            follows[i] = matching[0]
        if not follows:
            return None
        source = base
        broadcast = tuple(
            i for i in follows if np.array_equal(base, np.broadcast_to(base.take([0], axis=i), base.shape))
        )
        for i in broadcast:
            source = source.take([0], axis=i)
        for shape, value in values.items():  # the recipe must give every graph exactly its constant
            expected = source
            for i, a in follows.items():
                if i not in broadcast:
                    if shape[a] > expected.shape[i]:
                        return None  # longer than the base's: nothing to cut it from
                    expected = expected.take(range(shape[a]), axis=i)
            target = [shape[follows[i]] if i in follows else n for i, n in enumerate(base.shape)]
            if not np.array_equal(np.broadcast_to(expected, target), value):
                return None
        cut = tuple(sorted(set(follows) - set(broadcast)))
        return Sliced(np.ascontiguousarray(source), follows, broadcast, cut, tuple(base.shape))


def is_calibration(values: Mapping[Shape, np.ndarray]) -> bool:
    """What per-bucket calibration changes: float or 8-bit values of one shape in every graph (never a shape)."""
    first = next(iter(values.values()))
    same_shape = all(v.shape == first.shape for v in values.values())
    return same_shape and (first.dtype.kind == "f" or first.dtype in (np.int8, np.uint8))


def describe(values: Mapping[Shape, np.ndarray]) -> str:
    return ", ".join(f"{list(s)}: {list(v.shape)}" for s, v in values.items())


def any_batch_up_to(bounds: list[tuple[int, int]]) -> int:
    """The most rows one shape-dynamic model over buckets `bounds` (each axis's least, most) runs at
    any batch size from 1, unpadded; 0 where its smallest bucket is not 1 (no single rows come to it)."""
    least, most = bounds[0] if bounds else (0, 0)
    return most if least == 1 else 0


def any_length_up_to(bounds: list[tuple[int, int]]) -> int:
    """The longest text such a model runs at any width (its batch's longest row, below the shortest
    bucket too): where it spans several length buckets, so its length axis is free
    (retrieval/text_lengths.py, "tight" widths); 0 where it holds one length only."""
    return bounds[1][1] if len(bounds) == 2 and bounds[1][0] < bounds[1][1] else 0
