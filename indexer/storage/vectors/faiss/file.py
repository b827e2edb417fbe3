"""The on-disk frame of a FAISS index: MAGIC, header and body lengths, a JSON header, FAISS's own
serialization, and a CRC-32 over header and body.

Both directions stream, so a collection's index is never held twice in memory: saving writes FAISS's
serialization straight into the temp file (`faiss.serialize_index` would first build a second copy
of the whole index in memory), and loading checks the checksum in a first pass over the file, then
lets FAISS read the body in 1 MiB pieces from the same open descriptor (reading the file into bytes
and slicing out the body held three copies: 7.9 GiB for a 2 GB collection). The second pass
checksums what FAISS read as well, so a file changed between the two passes is refused, not
half-adopted.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import faiss

from indexer.fs.disk_full import write_atomically_with
from retrieval.json_text import loads
from retrieval.regular_file import UnusableFile, open_regular

MAGIC = b"CNCLIPIX1"
_LENGTHS = struct.Struct("<IQ")  # header length, body length
_CRC = struct.Struct("<I")
_HEAD = len(MAGIC) + _LENGTHS.size
_PIECE = 1 << 20  # what FAISS asks for at most per read or write through a callback
_MAX_HEADER = 1 << 24  # tombstones included; anything larger is not a file we wrote


class IndexFileError(Exception):
    """A saved index that cannot be used (missing, truncated, corrupt, other dim/model)."""


def write_index_file(path: Path, header: dict[str, Any], index: faiss.Index) -> None:
    """Write `header` and `index` to `path` atomically (temp file, fsync, rename)."""
    head = json.dumps(header).encode()

    def write(f: BinaryIO) -> None:
        f.write(MAGIC + _LENGTHS.pack(len(head), 0) + head)  # body length filled in below
        crc, body_len, failed = zlib.crc32(head), 0, []

        def piece(data: bytes) -> int:
            nonlocal crc, body_len
            try:
                f.write(data)
            except OSError as exc:  # FAISS turns it into a RuntimeError: keep the real one
                failed.append(exc)
                raise
            crc, body_len = zlib.crc32(data, crc), body_len + len(data)
            return len(data)

        try:
            faiss.write_index(index, faiss.PyCallbackIOWriter(piece, _PIECE))  # type: ignore[attr-defined]  # not in faiss's stubs
        except RuntimeError:
            if failed:
                raise failed[0] from None  # a full disk stays StorageFull
            raise
        f.write(_CRC.pack(crc))
        f.seek(len(MAGIC))
        f.write(_LENGTHS.pack(len(head), body_len))

    write_atomically_with(path, write, "save")


def read_index_file(path: Path, accept: Callable[[dict[str, Any]], None]) -> tuple[dict[str, Any], faiss.Index]:
    """The header and index saved at `path`; IndexFileError says why they cannot be used.
    `accept(header)` raises IndexFileError for a header the caller will not use, before FAISS reads
    the body (a file made for another model costs no deserialization)."""
    try:  # a regular file only: a FIFO or a device left at this name must not hang the open
        f = os.fdopen(open_regular(path), "rb")  # closed below; one descriptor for both passes
    except UnusableFile as exc:
        raise IndexFileError("no index file" if exc.missing else f"not an index file: it {exc.reason}") from exc
    with f:
        size = os.fstat(f.fileno()).st_size
        start = f.read(_HEAD)
        if size < _HEAD + _CRC.size or not start.startswith(MAGIC):
            raise IndexFileError("not an index file")
        header_len, body_len = _LENGTHS.unpack(start[len(MAGIC) :])
        if header_len > _MAX_HEADER or size != _HEAD + header_len + body_len + _CRC.size:
            raise IndexFileError("truncated index file")
        head = f.read(header_len)
        crc = _checksum_body(f, body_len, zlib.crc32(head))
        if crc != _CRC.unpack(f.read(_CRC.size))[0]:
            raise IndexFileError("checksum mismatch")
        try:
            header = loads(head)
            if not isinstance(header, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as exc:
            raise IndexFileError("unreadable header") from exc
        accept(header)
        f.seek(_HEAD + header_len)
        return header, _read_body(f, body_len, zlib.crc32(head), crc)


def _checksum_body(f: io.BufferedReader, length: int, crc: int) -> int:
    buffer = bytearray(16 * _PIECE)
    view = memoryview(buffer)
    left = length
    while left:
        got = f.readinto(view[: min(left, len(buffer))])
        if not got:
            raise IndexFileError("truncated index file")
        crc, left = zlib.crc32(view[:got], crc), left - got
    return crc


def _read_body(f: io.BufferedReader, length: int, crc: int, expected: int) -> faiss.Index:
    left = length

    def piece(size: int) -> bytes:
        nonlocal crc, left
        data = f.read(min(size, left))
        crc, left = zlib.crc32(data, crc), left - len(data)
        return data

    try:
        index = faiss.read_index(faiss.PyCallbackIOReader(piece, _PIECE))  # type: ignore[attr-defined]  # not in faiss's stubs
    except RuntimeError as exc:  # FAISS's own format checks
        raise IndexFileError(f"unreadable index: {str(exc).splitlines()[0]}") from exc
    if left:  # FAISS stopped early: the rest is unaccounted for
        crc = _checksum_body(f, left, crc)
    if crc != expected:
        raise IndexFileError("changed while being read")
    return index
