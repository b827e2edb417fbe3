"""The FAISS index file is streamed both ways: opening or saving a collection never holds its
vectors twice (issue 24: a 2 GB collection peaked at 7.9 GiB while opening), and a file changed
between the checksum pass and FAISS's read is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexer.storage.vectors.faiss.file import IndexFileError, read_index_file
from indexer.storage.vectors.faiss.index import VectorIndex

DIM = 256
ROWS = 200_000  # 205 MB of vectors: large against the interpreter, small for the suite

# Run in a fresh process so the peak (VmHWM, reset just before) is this load's or save's alone.
_PEAK = """
import json, sys
from pathlib import Path
from indexer.storage.vectors.faiss.index import VectorIndex

def status_mb(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024

path, action = Path(sys.argv[1]), sys.argv[2]
if action == "save":
    index = VectorIndex.load(path, {dim}, "Flat", "m")
    path.unlink()
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark (VmHWM) to now
before = status_mb("VmRSS")
if action == "load":
    index = VectorIndex.load(path, {dim}, "Flat", "m")
else:
    index.save(path)
print(json.dumps({{"before": before, "peak": status_mb("VmHWM"), "ntotal": index.ntotal}}))
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("index") / "c.faiss"
    index = VectorIndex(DIM, "Flat", "m")
    rng = np.random.default_rng(0)
    for start in range(0, ROWS, 50_000):
        index.add(np.arange(start, start + 50_000), rng.standard_normal((50_000, DIM), dtype=np.float32))
    index.save(path)
    return path


def _peak(path: Path, action: str) -> dict[str, Any]:
    script = _PEAK.format(dim=DIM)
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), action], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("action", ["load", "save"])
def test_opening_or_saving_an_index_holds_its_vectors_about_once(saved: Path, tmp_path: Path, action: str) -> None:
    vectors_mb = ROWS * DIM * 4 / 2**20
    path = saved if action == "load" else tmp_path / "again.faiss"
    if action == "save":
        path.write_bytes(saved.read_bytes())
    result = _peak(path, action)
    assert result["ntotal"] == ROWS
    grown = result["peak"] - result["before"]
    if action == "load":
        # The bound: the peak while opening ≤ 1.5× the vectors (reading the file into bytes
        # and slicing out the body held it three times, then FAISS's own copy).
        assert grown <= 1.5 * vectors_mb, result
    else:
        # Saving streams FAISS's serialization into the file: no second copy in memory.
        assert grown <= 0.25 * vectors_mb, result
    assert VectorIndex.load(path, DIM, "Flat", "m").ntotal == ROWS


def test_a_file_changed_between_the_checksum_and_the_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.faiss"
    index = VectorIndex(DIM, "Flat", "m")
    index.add(np.arange(100), np.ones((100, DIM), dtype=np.float32))
    index.save(path)

    def tamper(header: dict[str, Any]) -> None:  # runs after the checksum pass, before FAISS reads
        with open(path, "r+b") as f:  # the same inode, changed in place
            f.seek(-100, 2)
            f.write(b"\x7f" * 8)

    with pytest.raises(IndexFileError, match="changed while being read"):
        read_index_file(path, tamper)


def test_a_damaged_body_with_a_valid_checksum_is_an_index_file_error_not_a_crash(tmp_path: Path) -> None:
    import struct
    import zlib

    from indexer.storage.vectors.faiss.file import MAGIC

    header = json.dumps({"dim": 4, "factory": "Flat", "model": "m", "active": "Flat", "tombstones": []}).encode()
    for body in (b"IxM2" + b"\x00" * 3, b"garbage!" * 4):
        crc = zlib.crc32(body, zlib.crc32(header))
        path = tmp_path / "x.faiss"
        path.write_bytes(MAGIC + struct.pack("<IQ", len(header), len(body)) + header + body + struct.pack("<I", crc))
        with pytest.raises(IndexFileError):
            VectorIndex.load(path, 4, "Flat", "m")
