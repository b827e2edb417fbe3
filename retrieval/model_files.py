"""The files of a model directory, checked before anything opens them for real: every graph and data
file the manifest names is a regular file of a size its kind can have (retrieval/regular_file.py),
every graph's inputs and outputs have the shapes the manifest promises, and each file's sha256.

This module knows files, not manifests (retrieval/manifest.py imports it, never the reverse): it is
handed the names and the promised shapes (`ModelManifest.graph_shapes`). `ModelManifest.load` calls
`check_model_files` for every model directory, wherever one is named
(`CNCLIP_MODEL_DIR`, `CNCLIP_MODEL_DIRS`, `cnclip migrate --model`, …), so a directory whose
manifest says `image_size` 225 or `embed_dim` 64 while its graphs take 224 and give 128 is refused
in one line at once — not at warm-up (a traceback after the port is bound), and not after a
migration has made its shadow generation.

A graph's signature is read from the ONNX protobuf's wire format without parsing the rest: the
graph's `input` and `output` fields are found by skipping every other field by its length, so a
graph with inline weights costs a few page reads, and a file that is not a graph is one line.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from retrieval.errors import ModelError
from retrieval.regular_file import UnusableFile, check_regular, open_regular

# Protobuf messages cannot exceed 2 GiB, so no ONNX graph file can (weights beyond go to data files).
MAX_GRAPH_BYTES = (2 << 30) - 1
_GRAPH = 7  # ModelProto.graph
_INPUT, _OUTPUT = 11, 12  # GraphProto.input, GraphProto.output
_MAX_VALUE_INFO = 1 << 20  # an input's or output's name and shape
_MAX_FIELDS = 2_000_000  # nodes and initializers of one graph (ViT-H has ~10,000)

Dims = tuple[int | None, ...]  # None: a symbolic or unknown dimension


class GraphShapes(NamedTuple):
    """The input and output one graph file must have: names and shapes."""

    input_name: str
    input_shape: Dims
    output_name: str
    output_shape: Dims


# sha256 of files this process hashed, by (device, inode, size, mtime, ctime) of the file read: a model
# directory is checked in full before a server starts and loaded again by its encoder, hashed once.
_HASHED: dict[tuple[int, ...], str] = {}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The file's sha256, read only if it is a regular file (`UnusableFile` else)."""
    with os.fdopen(open_regular(path), "rb") as f:
        info = os.fstat(f.fileno())
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if key in _HASHED:
            return _HASHED[key]
        digest = hashlib.sha256()
        try:  # a regular file can still fail to read: a link to /proc/self/mem (EIO), a failing disk
            while block := f.read(chunk):
                digest.update(block)
        except OSError as exc:
            raise UnusableFile(path, f"cannot be read ({exc.strerror or exc})") from exc
    if len(_HASHED) >= 4096:
        _HASHED.clear()
    _HASHED[key] = digest.hexdigest()
    return _HASHED[key]


def max_data_bytes() -> int:
    """The largest weight file a model can have here: the machine's memory (it must fit to run)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 40


def check_model_files(directory: Path, files: Iterable[str], graphs: Mapping[str, GraphShapes]) -> None:
    """`ModelError` (one line) unless every file named (`files` and the keys of `graphs`) is a usable
    regular file in `directory` and every graph's input and output are the ones `graphs` gives."""
    data_limit = max_data_bytes()
    for name in sorted(set(files) | set(graphs)):
        path = directory / name
        try:
            if name in graphs:
                _check_graph(path, name, graphs[name])
            else:
                check_regular(path, data_limit)
        except UnusableFile as exc:
            if exc.missing:
                raise ModelError(f"model file missing: {path} (listed in manifest.json)") from None
            raise ModelError(f"model file {exc.message}") from None


def _check_graph(path: Path, name: str, expected: GraphShapes) -> None:
    input_name, input_shape, output_name, output_shape = expected
    inputs, outputs = graph_signature(path)
    for role, names, want_name, want in (
        ("input", inputs, input_name, input_shape),
        ("output", outputs, output_name, output_shape),
    ):
        if want_name not in names:
            have = ", ".join(names) or "none"
            raise ModelError(f"graph {name} has no {role} {want_name!r} (it has {have}), as manifest.json says")
        have_shape = names[want_name]
        if have_shape and not _agrees(have_shape, want):
            raise ModelError(
                f"graph {name}: {role} {want_name!r} has shape {_words(have_shape)}, manifest.json says {_words(want)} "
                "(image_size, context_length, embed_dim and the batch bucket must be the graph's)"
            )


def _agrees(have: Dims, want: Dims) -> bool:
    return len(have) == len(want) and all(h is None or h == w for h, w in zip(have, want, strict=True))


def _words(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def graph_signature(path: Path) -> tuple[dict[str, Dims], dict[str, Dims]]:
    """The graph's inputs and outputs (name -> shape) read from the file's wire format; `ModelError`
    when it is no ONNX graph; `UnusableFile` when it is no regular file of at most 2 GiB."""
    from google.protobuf.message import DecodeError
    from onnx import ValueInfoProto  # the message type of a value's name and shape

    fd = open_regular(path, MAX_GRAPH_BYTES)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise ModelError(f"graph {path} is empty (0 bytes), not an ONNX graph")
        try:
            graph = next(((at, n) for field, at, n in _fields(fd, 0, size) if field == _GRAPH), None)
            if graph is None:
                raise ValueError("it has no graph")
            found: tuple[dict[str, Dims], dict[str, Dims]] = ({}, {})
            for field, at, length in _fields(fd, graph[0], graph[0] + graph[1]):
                if field in (_INPUT, _OUTPUT) and length <= _MAX_VALUE_INFO:
                    info = ValueInfoProto.FromString(os.pread(fd, length, at))
                    shape = info.type.tensor_type.shape.dim
                    found[field == _OUTPUT][info.name] = tuple(
                        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in shape
                    )
            return found
        except (ValueError, DecodeError) as exc:
            raise ModelError(f"graph {path} is not an ONNX graph ({exc})") from None
    finally:
        os.close(fd)


def _varint(head: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(head) or shift > 63:
            raise ValueError("a truncated or overlong number")
        byte = head[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(fd: int, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, offset, length) of each length-delimited field of the message in bytes
    [start, end) of the file; other fields are skipped, nothing but keys and lengths is read."""
    at, count = start, 0
    while at < end:
        count += 1
        if count > _MAX_FIELDS:
            raise ValueError(f"more than {_MAX_FIELDS} fields in one message")
        head = os.pread(fd, min(20, end - at), at)
        key, used = _varint(head, 0)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, used = _varint(head, used)
        elif wire in (1, 5):
            used += 8 if wire == 1 else 4
        elif wire == 2:
            length, used = _varint(head, used)
            if at + used + length > end:
                raise ValueError("a field runs past the end of its message")
            yield field, at + used, length
            used += length
        else:
            raise ValueError(f"unknown wire type {wire}")
        at += used
    if at != end:
        raise ValueError("the last field runs past the end of its message")
