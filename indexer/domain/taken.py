"""When a photo was taken: read from its EXIF (the SQL that keeps it: indexer/storage/sql/taken.py).

Rules:
- EXIF DateTimeOriginal (tag 0x9003 of the Exif IFD) when it is a real date. With OffsetTimeOriginal
  (0x9011) it is an exact instant; without one (most cameras) it is the camera's wall clock, read in
  the time zone of the process that indexes (TZ), as photo managers do. Source `exif`.
- otherwise the file's modification time (source `mtime`), for files indexed from a folder;
- otherwise the time an upload was added (source `upload`).
Handed out aware (UTC); stored as naive UTC, like every timestamp in SQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from indexer.domain.records import TakenSource
from indexer.domain.values import as_utc
from retrieval.errors import CnclipError
from retrieval.preprocess import ImageHeader, read_header

# Older than photography, or later than tomorrow: a camera whose clock was never set, not a date.
EARLIEST = datetime(1826, 1, 1, tzinfo=UTC)

Taken = tuple[datetime, TakenSource]  # (aware UTC, source)


def exif_taken(data: bytes) -> datetime | None:
    """DateTimeOriginal of an image's EXIF as an aware UTC datetime; None when absent, not a date, or
    not an image at all."""
    try:
        header = read_header(data, max_bytes=len(data) or 1, max_pixels=2**62)
    except CnclipError:
        return None
    return parse_exif_datetime(header.date_original, header.offset_original)


def parse_exif_datetime(value: object, offset: object = None) -> datetime | None:
    """`YYYY:MM:DD HH:MM:SS` (+ an optional `±HH:MM` offset) as aware UTC; None for anything else."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.strptime(value.strip("\x00 ")[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    zone = _offset(offset)
    try:
        local = moment.replace(tzinfo=zone) if zone is not None else moment.astimezone()  # naive: local time
    except (OverflowError, ValueError):  # local time of 0001-01-01 00:00 east of UTC: before year 1
        return None
    aware = as_utc(local)  # None out of the calendar once in UTC (the datetime rule, indexer/domain/values.py)
    if aware is None or not EARLIEST <= aware <= datetime.now(UTC) + timedelta(days=1):
        return None
    return aware


def _offset(value: object) -> timezone | None:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    text = value.strip("\x00 ")
    digits = text[1:3] + text[4:]
    if len(text) != 6 or text[0] not in "+-" or text[3] != ":" or not (digits.isascii() and digits.isdigit()):
        return None
    minutes = int(text[1:3]) * 60 + int(text[4:])
    if minutes > 14 * 60:
        return None
    return timezone(timedelta(minutes=-minutes if text[0] == "-" else minutes))


def taken_from(header: ImageHeader | None, mtime: float | None) -> Taken:
    """When a photo was taken and how we know: the EXIF date its header carries, else its file's
    mtime, else now (an upload). `header` is the one the caller read anyway (`read_header`)."""
    exif = parse_exif_datetime(header.date_original, header.offset_original) if header is not None else None
    if exif is not None:
        return exif, "exif"
    if mtime is not None:
        try:
            return datetime.fromtimestamp(mtime, UTC), "mtime"
        except (OverflowError, OSError, ValueError):  # an mtime past year 9999 (utime takes any): no date
            pass
    return datetime.now(UTC), "upload"


def taken_of(data: bytes, mtime: float | None) -> Taken:
    """`taken_from` for bytes whose header nobody has read yet (one `read_header`)."""
    try:
        header: ImageHeader | None = read_header(data, max_bytes=len(data) or 1, max_pixels=2**62)
    except CnclipError:
        header = None
    return taken_from(header, mtime)
