"""Verified bytes as an HTTP response: the image route serves from memory what it hashed, never a
file again, so this module keeps what `FileResponse` gave: byte ranges and validators.

`ETag` is the content's sha256 (strong: the bytes are exactly those). One range (`bytes=a-b`,
`bytes=a-`, `bytes=-n`) is answered 206 with `Content-Range`; a range past the end 416 (in the one
error shape, api/errors.py); several ranges, a malformed header, or an `If-Range` that does not match
the ETag are ignored and the whole body is sent (RFC 9110 §14.2 lets a server ignore `Range`). `If-None-Match` with the ETag: 304.
"""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.responses import Response

from api.errors import error_response
from api.values import ascii_count

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def _one_range(header: str, size: int) -> tuple[int, int] | None | str:
    """(first, last) byte of a single satisfiable range, "unsatisfiable", or None (serve it all)."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or (not match[1] and not match[2]):
        return None
    # The request number rule (api/values.py): ASCII digits, a huge count not converted digit by digit.
    first_pos, last_pos = ascii_count(match[1]), ascii_count(match[2])
    if (match[1] and first_pos is None) or (match[2] and last_pos is None):
        return None  # digits of another script: malformed, ignored
    if first_pos is None:  # the last n bytes
        suffix = last_pos or 0
        return (max(0, size - suffix), size - 1) if suffix > 0 and size > 0 else "unsatisfiable"
    first = first_pos
    last = min(last_pos, size - 1) if last_pos is not None else size - 1
    if last_pos is not None and last_pos < first:
        return None  # syntactically invalid: ignored
    return (first, last) if first < size else "unsatisfiable"


def media_response(request: Request, data: bytes, sha256: str, media_type: str, headers: dict[str, str]) -> Response:
    """`data` (verified bytes with this sha256) as a 200, 206, 304 or 416 response to `request`."""
    etag = f'"{sha256}"'
    common = {**headers, "ETag": etag, "Accept-Ranges": "bytes"}
    if etag in [tag.strip() for tag in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=common)
    wanted = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if wanted is None or (if_range is not None and if_range.strip() != etag):
        return Response(data, media_type=media_type, headers=common)
    chosen = _one_range(wanted, len(data))
    if chosen is None:
        return Response(data, media_type=media_type, headers=common)
    if isinstance(chosen, str):  # unsatisfiable
        message = f"the range {wanted.strip()[:40]!r} starts past the end of the {len(data)} bytes"
        return error_response(
            416, "range_not_satisfiable", message, {**common, "Content-Range": f"bytes */{len(data)}"}
        )
    first, last = chosen
    part = data[first : last + 1]
    return Response(
        part,
        status_code=206,
        media_type=media_type,
        headers={**common, "Content-Range": f"bytes {first}-{last}/{len(data)}"},
    )
