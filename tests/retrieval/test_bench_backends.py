"""benchmarks/bench_backends.py runs tiny on the toy model and reports every case × configuration."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_backends import CASES, case_label, main
from retrieval.backends.openvino import capabilities
from retrieval.toolchain.toy_model import write_toy_model


def test_the_side_by_side_smoke_run(tmp_path: Path) -> None:
    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 8, 16), text_lengths=(16,))
    report = main(
        [
            "--model",
            str(model),
            "--rounds",
            "1",
            "--seconds",
            "0.01",
            "--no-torch",
            "--no-peak",
            "--out",
            str(tmp_path / "r.md"),
        ]
    )
    assert (tmp_path / "r.md").read_text() == report
    header = next(line for line in report.splitlines() if line.startswith("| case |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    expected = ["case", "shipped", "ORT int8 shared", "ORT int8 prepacked", "ORT fp32 shared"]
    expected += ["OpenVINO bf16"] if "BF16" in capabilities("CPU") else []
    assert columns == [*expected, "OpenVINO fp32", "OpenVINO default", "best PyTorch"]
    rows = {
        line.split("|")[1].strip(): line
        for line in report.splitlines()
        if line.startswith("| ") and "b" in line.split("|")[1]
    }
    for case in CASES:
        row = rows[case_label(*case)]
        assert "1.00×" in row.split("|")[2]  # shipped against itself
        assert row.count("×") == len(expected) + 1  # every engine measured; PyTorch skipped (--no-torch)
    assert "CPU has" in report and "load average" in report


def test_the_tuned_column_runs_what_the_tuning_file_chose(tmp_path: Path) -> None:
    import json

    from tests.support.tuning_files import tuning_for

    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 8, 16), text_lengths=(16,))
    text = {"precision": "fp32", "shapes": {"b1.l16": {"prepack": True, "prepack_gain": 1.5}}}
    (tmp_path / "t.json").write_text(json.dumps(tuning_for(model, text=text)))
    report = main(["--model", str(model), "--rounds", "1", "--seconds", "0.01", "--no-torch", "--no-peak"]
                  + ["--tuning", str(tmp_path / "t.json")])  # fmt: skip
    header = next(line for line in report.splitlines() if line.startswith("| case |"))
    assert header.rstrip().endswith("| tuned | best PyTorch | tuned ÷ fastest |")
    for case in CASES:
        row = next(line for line in report.splitlines() if line.startswith(f"| {case_label(*case)} |"))
        ratio = float(row.split("|")[-2].split()[0])
        assert ratio >= 1.0 and "(fastest: " in row  # the fastest of the same case, tuned included


def test_the_pytorch_table_gives_all_five_options_with_their_cosine_to_eager_fp32(tmp_path: Path) -> None:
    import dataclasses

    from benchmarks.bench_backends import _torch_table, torch_runner
    from retrieval.manifest import ModelManifest
    from tests.support.cnclip_models import TINY_VIT

    write_toy_model(tmp_path / "model", buckets=(1, 8, 16), text_lengths=(16,))
    toy = ModelManifest.load(tmp_path / "model")
    manifest = dataclasses.replace(toy, extra={"config": TINY_VIT}, image_size=TINY_VIT["image_resolution"])
    options = torch_runner(manifest, "image")
    assert options is not None
    cosine = {label: c for label, _, c in options}
    assert any("dynamic int8" in label for label in cosine) and len(cosine) == 5
    int8 = next(c for label, c in cosine.items() if "dynamic int8" in label)
    assert 0.99 < int8 < 0.9999999  # int8 weights move the vectors, a little
    samples = {("image b1", f"PyTorch: {label}"): [float(i + 1)] for i, label in enumerate(cosine)}
    samples["image b1", "shipped"] = [2.0]
    rows = [line for line in _torch_table(samples, {("image", f"PyTorch: {lb}"): c for lb, c in cosine.items()})
            if line.startswith("| image b1 |")]  # fmt: skip
    assert len(rows) == 5 and f"| {int8:.5f} |" in next(r for r in rows if "dynamic int8" in r)
    assert "| 2.00× |" in rows[0]  # shipped 2 ms ÷ 1 ms
