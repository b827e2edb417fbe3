"""A file over the image limit is refused before it is read (indexer/bulk/reading.py): a 3 GiB sparse file
that starts like a PNG costs no more memory than a small one, in a fresh process (its peak RSS,
VmHWM, is measured), and is reported as a bad file with its size and the limit; one that does not
claim to be an image is simply not an image; a file that grows after its size was checked is still
read only up to the limit + 1 byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from indexer.bulk import reading
from indexer.bulk.reading import read_file
from indexer.bulk.sources import SourceEntry

ROOT = Path(__file__).resolve().parents[3]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HUGE = 3 * 1024**3
LIMIT = 20 * 1024 * 1024


def sparse(path: Path, head: bytes, size: int = HUGE) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


# Run in a fresh interpreter: the peak RSS of this one (the whole suite so far) says nothing.
_MEASURE = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path

    def peak_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

    from indexer.bulk.pipeline import ImageIndexer
    from retrieval.fake import FakeEncoder
    from tests.support.indexer_helpers import jpeg, open_test_catalog, service_for

    folder, data = Path(sys.argv[1]), Path(sys.argv[2])
    catalog = open_test_catalog(data, f"sqlite:///{data / 'catalog.db'}")
    service = service_for(catalog, FakeEncoder(16))
    indexer = ImageIndexer(service, "photos", batch_size=4)
    asyncio.run(indexer.run(folder))  # a first run: everything imported and warmed up
    baseline = peak_mb()
    (folder / "later.jpg").write_bytes(jpeg(7))
    Path(sys.argv[3]).rename(folder / "huge.png")  # the sparse file arrives now
    Path(sys.argv[4]).rename(folder / "huge.mp4")
    summary = asyncio.run(indexer.run(folder))
    catalog.close()
    print(json.dumps({"baseline": baseline, "peak": peak_mb(), "added": summary.added,
                      "failures": summary.failures, "not_images": summary.not_images}))
    """
)


def test_a_3_gib_sparse_png_is_refused_without_being_read(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    from tests.support.indexer_helpers import jpeg

    (folder / "small.jpg").write_bytes(jpeg(1))
    huge = sparse(tmp_path / "huge.png", PNG_SIGNATURE + b"\x00\x00\x00\rIHDR")
    video = sparse(tmp_path / "huge.mp4", b"\x00\x00\x00\x18ftypmp42")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(folder), str(tmp_path / "data"), str(huge), str(video)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peak"] - result["baseline"] < 200, result  # MB: it was 2,000+ when the file was read whole
    assert result["added"] == 1 and result["not_images"] == 1  # the .mp4 is no image: not a failure
    assert result["failures"] == [
        [str(folder / "huge.png"), f"the image is {HUGE:,} bytes; the limit is {LIMIT:,} bytes"]
    ], result


def test_a_file_that_grows_after_its_size_was_checked_is_read_up_to_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = sparse(tmp_path / "growing.png", PNG_SIGNATURE, 64 * 1024**2)
    real_fstat = os.fstat
    sizes: list[int] = []

    def small_at_first(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        if sizes or sys._getframe(1).f_globals["__name__"] != "indexer.bulk.reading":
            return info
        sizes.append(info.st_size)  # the reader's first look: the file was still small then
        fields = list(info)
        fields[6] = 1000  # st_size
        return os.stat_result(fields)

    real_fdopen = os.fdopen
    asked: list[int] = []

    def counting_fdopen(fd: int, mode: str = "rb"):  # type: ignore[no-untyped-def]
        handle = real_fdopen(fd, mode)
        original = handle.read

        def read(size: int = -1) -> bytes:
            asked.append(size)
            return original(size)

        handle.read = read  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(reading.os, "fstat", small_at_first)
    monkeypatch.setattr(reading.os, "fdopen", counting_fdopen)
    result = read_file(SourceEntry(path, root=tmp_path), None, None, None, LIMIT)
    assert asked == [LIMIT + 1]  # never an unbounded read
    assert result == (str(path), f"the image is {64 * 1024**2:,} bytes; the limit is {LIMIT:,} bytes")


def test_the_limit_is_the_services(tmp_path: Path) -> None:
    """A file just over a configured limit is refused with that limit; at the limit it is read."""
    from tests.support.indexer_helpers import jpeg

    data = jpeg(3)
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    refused = read_file(SourceEntry(path, root=tmp_path), None, None, None, len(data) - 1)
    assert refused == (str(path), f"the image is {len(data):,} bytes; the limit is {len(data) - 1:,} bytes")
    read = read_file(SourceEntry(path, root=tmp_path), None, None, None, len(data))
    assert not isinstance(read, tuple) and read is not None and read.data == data
