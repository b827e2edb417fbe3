"""What `cnclip tune` prints and writes: the measurement table, the choice, the tuning file.

The command (cli/tune.py) is a thin caller of `tune_and_write`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from retrieval.backends import DEFAULT_BACKEND as ONNXRUNTIME  # the shipped default: the table's baseline
from retrieval.toolchain.tune.tuner import Progress, TuneOptions, TuneResult, run_tune
from retrieval.tuning import TUNING_NAME, write_tuning


def table(result: TuneResult) -> list[str]:
    """Markdown rows: every measurement, × against the shipped default (ONNX Runtime's default precision,
    shared weights) at the same shape, the chosen configuration marked."""
    t = result.tuning
    lines = ["| tower | shape | backend | device | precision | weights | ms (min–max) | × shipped | chosen |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    shipped: dict[tuple[str, str], float] = {}
    for m in t.measurements:
        if m.backend == ONNXRUNTIME.name and m.weights == "shared":
            default = next(iter(ONNXRUNTIME.precisions(m.device, ["int8", "fp32", "fp16"])), None)
            if m.precision == default or (m.tower, m.shape) not in shipped:
                shipped[m.tower, m.shape] = m.ms
    for m in t.measurements:
        choice = t.towers[m.tower]
        shape = choice.shapes.get(m.shape)
        mode = "prepacked" if shape is not None and shape.prepack else ("shared" if m.weights != "own" else "own")
        chosen = (m.backend, m.precision, m.weights) == (
            choice.backend,
            choice.precision,
            mode if m.weights != "own" else "own",
        )
        base = shipped.get((m.tower, m.shape))
        ratio = f"{base / m.ms:.2f}×" if base and m.ms else "–"
        lines.append(
            f"| {m.tower} | {m.shape} | {m.backend} | {m.device} | {m.precision} | {m.weights} | "
            f"{m.ms:.2f} ({m.ms_min:.2f}–{m.ms_max:.2f}) | {ratio} | {'**yes**' if chosen else ''} |"
        )
    return lines


def choice_lines(result: TuneResult) -> list[str]:
    """The choice per tower and the gate's verdicts, in words."""
    lines = [f"gate: {r.line()}" for r in result.gate]
    lines += [f"skipped: {reason}" for reason in result.skipped]
    lines.append(f"chosen: {result.tuning.summary()}")
    return lines


def tune_and_write(
    model_dir: Path, out: Path | None, options: TuneOptions, progress: Progress, echo: Callable[[str], None]
) -> Path:
    """Measure, print the table and the choice through `echo`, write the tuning file atomically."""
    result = run_tune(model_dir, options, progress)
    for line in [*table(result), "", *choice_lines(result)]:
        echo(line)
    path = write_tuning(out if out is not None else Path(model_dir) / TUNING_NAME, result.tuning)
    echo(f"wrote {path}")
    return path
