"""Request bodies read under a budget: bytes after decompression and JSON values, both counted while
the body arrives, so a small hostile body is refused before it costs memory or CPU.

Why counting, not parsing, decides: Python's JSON parsers (json, pydantic-core) hold the GIL for the
whole document, so parsing a 60 MB list of 15 M rows in a worker thread still freezes the event
loop for seconds and leaves a gigabyte of Python objects behind. Counting the structural bytes `,`
`[` `{` of each arriving piece is a C `bytes.count` over at most a megabyte at a time, and it bounds
what a parse can cost: a JSON document holds at most (commas + containers + 1) values, and as many
object keys. (Commas inside strings are counted too: an over-estimate, which only errs towards
refusing, and the limits leave room for that.) Only a body within its budget is parsed — off the
event loop, by the caller.

gzip / deflate bodies are inflated piece by piece (`zlib.decompressobj` with `max_length`) in a
worker thread, so a compressed body can never expand past its byte budget, even inside one piece.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterable
from dataclasses import dataclass

import anyio.to_thread

from api.errors import UnsupportedEncoding
from retrieval.errors import InvalidInput, PayloadTooLarge

_STEP = 1 << 20  # largest inflated piece per zlib call: each budget check sees at most this much new data
# A body up to this size is parsed on the event loop (well under a millisecond); larger ones in a worker thread.
INLINE_PARSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class BodyBudget:
    """What one request body may cost. `max_json_values` counts only the first `json_bytes` bytes of the
    (decompressed) body when given: the binary tensor data after a KServe v2 JSON header is not JSON."""

    max_bytes: int
    max_json_values: int
    json_bytes: int | None = None


class _Meter:
    """Bytes and JSON values seen so far; raises `PayloadTooLarge` as soon as either is over budget."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0
        self.values = 1  # the document itself

    def add(self, piece: bytes) -> None:
        start = self.size
        self.size += len(piece)
        if self.size > self.budget.max_bytes:
            raise PayloadTooLarge(f"the request body is larger than the limit of {self.budget.max_bytes:,} bytes")
        end = len(piece) if self.budget.json_bytes is None else max(0, min(len(piece), self.budget.json_bytes - start))
        if end:
            json_part = piece[:end] if end < len(piece) else piece
            self.values += json_part.count(b",") + json_part.count(b"[") + json_part.count(b"{")
            if self.values > self.budget.max_json_values:
                raise PayloadTooLarge(
                    f"the request body holds more than {self.budget.max_json_values:,} JSON values; "
                    "send fewer items per request"
                )


class _Inflater:
    """gzip or deflate, inflated in pieces of at most `_STEP` bytes; each piece goes to the meter."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        # tritonclient's deflate is zlib-wrapped; raw deflate is tried when the zlib header is missing.
        self.wbits = [zlib.MAX_WBITS | 16] if encoding != "deflate" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
        self.inflater = zlib.decompressobj(self.wbits.pop(0))
        self.started = False

    def feed(self, data: bytes, meter: _Meter, out: list[bytes]) -> None:
        """Blocking (zlib, counting): call in a worker thread."""
        while data and not self.inflater.eof:  # bytes after the end of the stream are ignored, as before
            try:
                piece = self.inflater.decompress(data, _STEP)
            except zlib.error:
                if self.started or not self.wbits:
                    raise InvalidInput(f"the request body is not valid {self.encoding} data") from None
                self.inflater = zlib.decompressobj(self.wbits.pop(0))
                continue
            self.started = True
            meter.add(piece)
            out.append(piece)
            data = self.inflater.unconsumed_tail

    def finish(self) -> None:
        if not self.inflater.eof:
            raise InvalidInput(f"the {self.encoding} request body is truncated")


def _inflater(content_encoding: str | None) -> _Inflater | None:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return None
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(f"Unsupported compression type '{encoding}' (gzip and deflate are supported)")
    return _Inflater(encoding)


async def read_within(chunks: AsyncIterable[bytes], budget: BodyBudget, content_encoding: str | None = None) -> bytes:
    """The whole body (decompressed for `Content-Encoding: gzip|deflate`), or `PayloadTooLarge` the moment
    its bytes or JSON values go over `budget` (`InvalidInput` for broken compressed data,
    `UnsupportedEncoding` for another encoding)."""
    inflater = _inflater(content_encoding)
    meter = _Meter(budget)
    received = 0
    out: list[bytes] = []
    async for chunk in chunks:
        if not chunk:
            continue
        received += len(chunk)
        if received > budget.max_bytes:  # compressed data is never larger than what it inflates to, in practice
            raise PayloadTooLarge(f"the request body is larger than the limit of {budget.max_bytes:,} bytes")
        if inflater is None:
            meter.add(chunk)  # a network read (64 KiB at most): cheap enough for the event loop
            out.append(chunk)
        else:
            await anyio.to_thread.run_sync(inflater.feed, chunk, meter, out)
    if inflater is not None:
        inflater.finish()
    return b"".join(out)
