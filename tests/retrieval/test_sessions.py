"""Provider and precision choice (with fake detection: no NPU or GPU here), session options,
bucketed sessions over the toy model, and the stream pool."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from retrieval.backends.base import Detection, SessionConfig, cpu_thread_plan
from retrieval.backends.onnxruntime import (
    choose_precision,
    choose_provider,
    detect_ascend,
    detect_cuda,
    ort_providers,
    ort_session_options,
)
from retrieval.errors import EncoderUnavailable, ModelError
from retrieval.machine_limits import CoreGate
from retrieval.manifest import ModelManifest
from retrieval.sessions import BucketedSession, ModelSession, Stream, StreamPool, dummy_batch

CANN_BUILD = lambda: ["CANNExecutionProvider", "CPUExecutionProvider"]  # noqa: E731 - onnxruntime-cann
CUDA_BUILD = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]  # noqa: E731
ALL_BUILD = lambda: ["CANNExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]  # noqa: E731
YES = lambda: Detection(True, "found it")  # noqa: E731
NO = lambda: Detection(False, "nothing there")  # noqa: E731


def test_auto_prefers_npu_then_gpu_then_cpu() -> None:
    assert choose_provider("auto", ALL_BUILD, cann=YES, cuda=YES).name == "cann"
    assert choose_provider("auto", ALL_BUILD, cann=NO, cuda=YES).name == "cuda"
    choice = choose_provider("auto", ALL_BUILD, cann=NO, cuda=NO)
    assert choice.name == "cpu" and "nothing there" in choice.reason


def test_auto_never_asks_for_a_provider_the_build_lacks() -> None:
    asked = []

    def ascend() -> Detection:
        asked.append("ascend")
        return Detection(True, "npu")

    choice = choose_provider("auto", CUDA_BUILD, cann=ascend, cuda=NO)
    assert choice.name == "cpu" and asked == []
    assert "no CANNExecutionProvider" in choice.reason


def test_cann_build_without_toolkit_falls_back_to_cpu_with_reason() -> None:
    # The situation of this machine: onnxruntime-cann lists CANN, but there is no toolkit or device.
    choice = choose_provider("auto", CANN_BUILD, cann=NO, cuda=YES)
    assert choice.name == "cpu"
    assert "nothing there" in choice.reason and "no CUDAExecutionProvider" in choice.reason


def test_explicit_provider_that_cannot_work_is_an_error() -> None:
    with pytest.raises(EncoderUnavailable, match="nothing there"):
        choose_provider("cann", CANN_BUILD, cann=NO, cuda=NO)
    with pytest.raises(EncoderUnavailable, match="no CUDAExecutionProvider"):
        choose_provider("cuda", CANN_BUILD, cann=YES, cuda=YES)
    assert choose_provider("cann", CANN_BUILD, cann=YES, cuda=NO).name == "cann"
    assert choose_provider("cpu", CANN_BUILD, cann=YES, cuda=YES).name == "cpu"


def test_detect_ascend_needs_library_and_device(tmp_path: Path) -> None:
    home = tmp_path / "ascend"
    assert not detect_ascend({"ASCEND_HOME_PATH": str(home)}, devices=["/dev/davinci0"]).found
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / "libascendcl.so").write_bytes(b"")
    no_device = detect_ascend({"ASCEND_HOME_PATH": str(home)}, devices=[])
    assert not no_device.found and "davinci" in no_device.reason
    found = detect_ascend({"ASCEND_HOME_PATH": str(home)}, devices=["/dev/davinci0", "/dev/davinci1"])
    assert found.found and "2 NPU" in found.reason


def test_detect_cuda_needs_driver_and_device() -> None:
    assert not detect_cuda(devices=["/dev/nvidia0"], libcuda=None).found
    assert not detect_cuda(devices=[], libcuda="libcuda.so.1").found
    assert detect_cuda(devices=["/dev/nvidia0"], libcuda="libcuda.so.1").found


def test_this_machine_resolves_to_cpu() -> None:
    assert choose_provider("auto").name == "cpu"


def test_precision_choice() -> None:
    assert choose_precision("cpu", "auto", ["fp32", "int8"]) == "int8"
    assert choose_precision("cpu", "auto", ["fp32", "fp16"]) == "fp32"
    assert choose_precision("cann", "auto", ["fp32", "fp16", "int8"]) == "fp16"
    assert choose_precision("cuda", "auto", ["fp32", "int8"]) == "fp32"
    assert choose_precision("cpu", "fp32", ["fp32", "int8"]) == "fp32"
    with pytest.raises(ModelError, match="only has fp32"):
        choose_precision("cpu", "int8", ["fp32"])


def test_provider_options() -> None:
    cann = ort_providers(SessionConfig(provider="cann", precision="fp16", device_id=3))
    name, options = cann[0]
    assert name == "CANNExecutionProvider"
    assert options == {"device_id": "3", "enable_cann_graph": "1", "precision_mode": "must_keep_origin_dtype"}
    assert ort_providers(SessionConfig(provider="cuda", precision="fp16", device_id=1))[0] == (
        "CUDAExecutionProvider",
        {"device_id": "1"},
    )
    assert ort_providers(SessionConfig(provider="cpu", precision="int8")) == ["CPUExecutionProvider"]


def test_cpu_threads_and_affinity() -> None:
    assert cpu_thread_plan(streams=2, threads_per_stream=0, cores=4) == [[0, 1], [2, 3]]
    assert cpu_thread_plan(streams=1, threads_per_stream=0, cores=2) == [[0, 1]]
    assert cpu_thread_plan(streams=4, threads_per_stream=0, cores=2) == [[0], [1], [0], [1]]
    assert cpu_thread_plan(streams=2, threads_per_stream=3, cores=8) == [[0, 1, 2], [3, 4, 5]]
    pinned = SessionConfig(provider="cpu", precision="int8", cores=[2, 3, 4], pin_threads=True, spin=False)
    options = ort_session_options(pinned)
    assert options.intra_op_num_threads == 3
    # ORT pins the two extra pool threads (1-based processor ids); the caller thread pins itself.
    assert options.get_session_config_entry("session.intra_op_thread_affinities") == "4;5"
    # Spinning inside a run only: the pool stops spinning when the run ends (the cores go on).
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    unpinned = ort_session_options(SessionConfig(provider="cpu", precision="int8", cores=[0, 1]))
    assert unpinned.intra_op_num_threads == 2
    with pytest.raises(Exception, match="intra_op_thread_affinities"):
        unpinned.get_session_config_entry("session.intra_op_thread_affinities")


def test_bucketed_session_runs_only_its_buckets(toy_model_dir: Path) -> None:
    manifest = ModelManifest.load(toy_model_dir)
    config = SessionConfig(provider="cpu", precision="fp32", cores=[0])
    session = BucketedSession.open(manifest, "text", "fp32", [1, 4], config)
    assert session.buckets == [1, 4]
    out = session.run(dummy_batch("text", 4, 224, 52))
    assert out.shape == (4, 32) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    with pytest.raises(ModelError, match="batch of 3 is not a bucket"):
        session.run(dummy_batch("text", 3, 224, 52))


def test_missing_graph_is_a_model_error(toy_model_dir: Path, tmp_path: Path) -> None:
    manifest = ModelManifest.load(toy_model_dir)
    broken = ModelManifest(**{**manifest.__dict__, "directory": tmp_path})
    with pytest.raises(ModelError, match="cannot open graph"):
        BucketedSession.open(broken, "image", "fp32", [1], SessionConfig(provider="cpu", precision="fp32"))


class _Echo:
    def run(self, batch: np.ndarray) -> np.ndarray:
        return np.ones((len(batch), 2), np.float32)


def test_stream_pool_hands_out_the_stream_idle_longest() -> None:
    async def scenario() -> list[int]:
        streams = [Stream(i, BucketedSession("text", {1: _Echo()})) for i in range(3)]
        pool = StreamPool(streams)
        order = []
        a = await pool.acquire()
        b = await pool.acquire()
        pool.release(a)
        c = await pool.acquire()
        d = await pool.acquire()
        order = [a.index, b.index, c.index, d.index]
        assert pool.idle == 0
        pool.release(b)
        pool.close()
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 0]


def test_stream_counts_work_and_warms_every_bucket() -> None:
    runs = []

    class Recorder:
        def run(self, batch: np.ndarray) -> np.ndarray:
            runs.append(batch.shape)
            return np.zeros((len(batch), 2), np.float32)

    stream = Stream(0, BucketedSession("image", {1: Recorder(), 4: Recorder()}))
    stream.warm_up(image_size=8, context_length=52)
    # Each once, then timed in turns (5 rounds: each run is short).
    assert runs == [(1, 3, 8, 8), (4, 3, 8, 8)] * 6
    assert sorted(stream.bucket_seconds) == [1, 4] and all(s >= 0 for s in stream.bucket_seconds.values())
    stream.run_timed(np.zeros((4, 3, 8, 8), np.float32))
    assert stream.batches == 1 and stream.busy_seconds >= 0
    stream.close()


@pytest.mark.parametrize("urgent", [True, False])
def test_a_streams_run_holds_its_threads_of_the_gate_and_a_text_stream_goes_first(urgent: bool) -> None:
    gate = CoreGate(2, overtake_s=5.0)
    order: list[str] = []
    echo: dict[int, ModelSession] = {1: _Echo()}
    stream = Stream(0, BucketedSession("text", echo), gate=gate, threads=2, urgent=urgent)
    busy = gate.hold(2)
    busy.__enter__()

    def decode() -> None:
        with gate.hold(1):
            order.append("decode")

    def run() -> None:
        stream.run_timed(np.zeros((1, 52), np.int64))
        order.append("stream")

    waiting = [threading.Thread(target=decode), threading.Thread(target=run)]
    for thread in waiting:
        thread.start()
        time.sleep(0.02)  # the decode is in line first
    assert order == []  # the gate is busy: the stream's run waits for its 2 threads
    busy.__exit__(None, None, None)
    for thread in waiting:
        thread.join(5)
    assert order == (["stream", "decode"] if urgent else ["decode", "stream"])
    assert gate.peak == 2 and stream.batches == 1
    stream.close()
