"""OpenVINO's mapped weight file goes back to the page cache once compiled (retrieval/backends/mapped_weights.py).

OpenVINO keeps a graph's weight file mapped after compiling, every page it read resident beside the
compiled copy: 399 of the ViT-B-16 image tower's 728 MB in bf16 (issue 34). These tests hold a
session to no resident pages of its weight file after its first run (a fresh process, against the
same process with the release switched off), to the same answers after the release and for a shape
first run after it, and the release to shared read-only mappings of the folder it is given.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from retrieval.backends.mapped_weights import release_resident, shared_read_only_maps
from retrieval.graph_store import save_sharing_weights

pytest.importorskip("openvino")

WIDTH, HIDDEN = 512, 8192  # two 16 MB matrices: 32 MB of weights to weigh


def write_mlp(directory: Path, buckets: tuple[int, ...]) -> dict[int, Path]:
    """x [b, WIDTH] → MatMul → Relu → MatMul, one graph per batch bucket, one weight file (`mlp.data`)."""
    rng = np.random.default_rng(0)
    up = rng.normal(0, 0.05, (WIDTH, HIDDEN)).astype(np.float32)
    down = rng.normal(0, 0.05, (HIDDEN, WIDTH)).astype(np.float32)

    def graph(batch: int) -> onnx.ModelProto:
        nodes = [
            helper.make_node("MatMul", ["x", "up"], ["u"]),
            helper.make_node("Relu", ["u"], ["r"]),
            helper.make_node("MatMul", ["r", "down"], ["y"]),
        ]
        body = helper.make_graph(
            nodes,
            "mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, WIDTH])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, WIDTH])],
            [numpy_helper.from_array(up, "up"), numpy_helper.from_array(down, "down")],
        )
        return helper.make_model(body, opset_imports=[helper.make_opsetid("", 13)])

    directory.mkdir(parents=True, exist_ok=True)
    save_sharing_weights({f"mlp.b{b}.onnx": graph(b) for b in buckets}, directory, "mlp.data")
    return {b: directory / f"mlp.b{b}.onnx" for b in buckets}


RUN = """
import json, sys
from pathlib import Path
import numpy as np
import retrieval.backends.openvino as backend
from retrieval.backends.base import SessionConfig

paths, release = {int(b): Path(p) for b, p in json.loads(sys.argv[1]).items()}, sys.argv[2] == "on"
if not release:
    backend.release_resident = lambda folders: 0


def resident_kb(name):
    kb, current = 0, ""
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if not fields[0].endswith(":"):
                current = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:" and current.endswith(name):
                kb += int(fields[1])
    return kb


config = SessionConfig(provider="CPU", precision="fp32", cores=[0], backend="openvino", run_precision="fp32")
sessions = {b: backend.OpenVinoSession(p, config, "x", "y") for b, p in paths.items()}
batches = {b: np.random.default_rng(b).normal(0, 1, (b, 512)).astype(np.float32) for b in paths}
first = {b: sessions[b].run(batches[b]).tolist() for b in sorted(paths)}
resident = resident_kb("mlp.data")
again = {b: sessions[b].run(batches[b]).tolist() for b in sorted(paths)}
print(json.dumps({"resident_kb": resident, "first": first, "again": again}))
"""


def _run(paths: dict[int, Path], release: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps({b: str(p) for b, p in paths.items()}), release],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_sessions_weight_file_is_not_resident_after_its_first_run_and_its_answers_hold(tmp_path: Path) -> None:
    paths = write_mlp(tmp_path, (1, 4))
    weights_kb = (tmp_path / "mlp.data").stat().st_size / 1024
    kept = _run(paths, "off")
    released = _run(paths, "on")
    # Without the release the compiled model leaves the file it read resident: the measurement sees it.
    assert kept["resident_kb"] >= 0.9 * weights_kb, (kept["resident_kb"], weights_kb)
    assert released["resident_kb"] <= 0.05 * weights_kb, (released["resident_kb"], weights_kb)
    for b in ("1", "4"):  # the second shape's first run came after the first shape's release
        np.testing.assert_array_equal(released["first"][b], kept["first"][b])
        np.testing.assert_array_equal(released["again"][b], kept["first"][b])


def _maps_line(start: int, end: int, perms: str, path: str) -> str:
    return f"{start:x}-{end:x} {perms} 00000000 fd:01 1234                       {path}\n"


def test_only_shared_read_only_mappings_of_files_directly_in_the_folder_are_found(tmp_path: Path) -> None:
    folder = tmp_path / "model dir"  # a space in the path, as a user's folder may have
    folder.mkdir()
    lines = [
        _maps_line(0x1000, 0x3000, "r--s", f"{folder}/image.fp32.data"),
        _maps_line(0x3000, 0x4000, "r--p", f"{folder}/image.int8.data"),  # private: may hold its own bytes
        _maps_line(0x4000, 0x5000, "rw-s", f"{folder}/text.fp32.data"),  # writable: may be written
        _maps_line(0x5000, 0x6000, "r--s", f"{folder}/sub/other.data"),  # not directly in the folder
        _maps_line(0x6000, 0x7000, "r--s", f"{tmp_path}/model dir2/x.data"),  # a neighbour sharing a prefix
        _maps_line(0x7000, 0x8000, "r--s", f"{folder}/text.int8.data (deleted)"),  # replaced on disk
        "7f00-8000 r--s 00000000 00:00 0 \n",  # anonymous
        "garbage\n",
    ]
    maps = tmp_path / "maps"
    maps.write_text("".join(lines))
    found = shared_read_only_maps([folder], maps=str(maps))
    assert [(start, end, path.name) for start, end, path in found] == [
        (0x1000, 0x3000, "image.fp32.data"),
        (0x7000, 0x8000, "text.int8.data (deleted)"),
    ]
    assert shared_read_only_maps([folder], maps=str(tmp_path / "missing")) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps")
def test_the_release_keeps_every_byte_and_leaves_private_mappings_alone(tmp_path: Path) -> None:
    shared_file, private_file = tmp_path / "weights.data", tmp_path / "scratch.data"
    content = np.random.default_rng(0).integers(0, 256, 4 * mmap.PAGESIZE, dtype=np.uint8).tobytes()
    shared_file.write_bytes(content)
    private_file.write_bytes(content)
    with open(shared_file, "rb") as f, open(private_file, "r+b") as g:
        shared = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        private = mmap.mmap(g.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert shared[:] == content
    private[:4] = b"mine"  # a private page the file does not hold: dropping it would lose it
    assert release_resident([tmp_path]) == len(content)  # the shared mapping only
    assert shared[:] == content  # faulted back from the file
    assert private[:4] == b"mine" and private[4:] == content[4:]
    shared.close()
    private.close()
