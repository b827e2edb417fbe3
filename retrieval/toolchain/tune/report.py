"""What `cnclip tune` prints and writes: the measurement table, the choice, the tuning file.

The command (cli/tune.py) is a thin caller of `tune_and_write`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from retrieval.backends import DEFAULT_BACKEND as ONNXRUNTIME  # the shipped default: the table's baseline
from retrieval.toolchain.tune.tuner import Progress, TuneOptions, TuneResult, run_tune
from retrieval.tuning import TUNING_NAME, TuningFile, write_tuning

# Under the table: how its text cases were timed (retrieval/toolchain/tune/measure.py `case_batch`).
WIDTHS_NOTE = (
    "text on a session that runs any width (the one shape-dynamic session over several length buckets) is timed "
    "at its served width (the middle of the widths each length bucket holds, as the encoder cuts a batch to its "
    "longest row); on other sessions padded to the bucket"
)


def table(result: TuneResult) -> list[str]:
    """Markdown rows: every measurement, × against the shipped default (ONNX Runtime's default precision
    on its one shape-dynamic session where that was measured, else shared weights) at the same shape,
    the chosen configuration marked."""
    t = result.tuning
    lines = ["| tower | shape | backend | device | precision | weights | ms (min–max) | × shipped | chosen |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    shipped: dict[tuple[str, str], float] = {}
    ort = [m for m in t.measurements if m.backend == ONNXRUNTIME.name]
    default_mode = "dynamic" if any(m.weights == "dynamic" for m in ort) else "shared"
    for m in ort:
        if m.weights == default_mode:
            default = next(iter(ONNXRUNTIME.precisions(m.device, ["int8", "fp32", "fp16"])), None)
            if m.precision == default or (m.tower, m.shape) not in shipped:
                shipped[m.tower, m.shape] = m.ms
    for m in t.measurements:
        choice = t.towers[m.tower]
        shape = choice.shapes.get(m.shape)
        mode = "prepacked" if shape is not None and shape.prepack else ("shared" if m.weights != "own" else "own")
        if choice.dynamic and mode != "prepacked":  # a prepacked shape runs beside the one session
            mode = "dynamic"
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
    if any(m.tower == "text" and m.weights == "dynamic" for m in t.measurements):
        lines += ["", WIDTHS_NOTE]
    return lines


def choice_lines(result: TuneResult) -> list[str]:
    """The choice per tower and the gate's verdicts, in words."""
    lines = [f"gate: {r.line()}" for r in result.gate]
    lines += [f"skipped: {reason}" for reason in result.skipped]
    lines.append(f"chosen: {result.tuning.summary()}")
    return lines + report_lines(result.tuning)


def report_lines(tuning: TuningFile) -> list[str]:
    """The run's report in words: memory peak, duration, load, the validation, and whether the file
    can be trusted."""
    r = tuning.report
    if r is None:
        return []
    again = ", measured twice" if r.measurements > 1 else ""
    validating = f", validating {r.validate_peak_rss_mb:.0f} MB with its worker" if r.validate_peak_rss_mb else ""
    lines = [
        f"took {r.seconds:.0f} s{again}; peak memory {r.peak_rss_mb:.0f} MB (quality gate included); measuring "
        f"{r.measure_peak_rss_mb:.0f} MB, one configuration open at a time (between them {r.base_rss_mb:.0f} MB, "
        f"the largest added {r.largest_candidate_mb:.0f} MB){validating}",
        f"load: other processes used {r.other_cpu_cores:.2f} cores while it measured; load average "
        f"{r.load_average:.1f} at the start; {r.noisy_cases} noisy case(s)",
    ]
    for p in r.validation:
        ratio = p.tuned_items_s / p.default_items_s if p.default_items_s else 0.0
        lines.append(
            f"validated over HTTP (a cnclip worker each, as serve runs them): {p.tower} at concurrency "
            f"{p.concurrency}: {p.tuned_items_s:.1f} items/s tuned, {p.default_items_s:.1f} default ({ratio:.2f}×)"
        )
    lines += [
        f"kept the defaults for {t}: the choice ({r.rejected[t].words() if t in r.rejected else '?'}) was not "
        "faster than them"
        for t in r.kept_defaults
    ]
    if not tuning.trusted:
        lines.append(f"UNTRUSTED: {tuning.untrusted_reason}; serve ignores this file and runs the defaults")
    return lines


def tune_and_write(
    model_dir: Path,
    out: Path | None,
    options: TuneOptions,
    progress: Progress,
    echo: Callable[[str], None],
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Measure, print the table and the choice through `echo` (warnings through `warn`), write the
    tuning file atomically."""
    say = warn if warn is not None else echo
    result = run_tune(model_dir, options, progress, say)
    if not result.tuning.trusted:
        say(
            f"warning: still noisy when measured again ({result.tuning.untrusted_reason}): the tuning file is "
            "written marked untrusted, serve ignores it and runs the defaults; run `cnclip tune` again when "
            "the machine is quiet (or pass --accept-noise on a host that never is)"
        )
    elif result.warnings and options.accept_noise:
        say(f"warning: noisy ({result.warnings[0]}); written trusted all the same (--accept-noise)")
    for line in [*table(result), "", *choice_lines(result)]:
        echo(line)
    path = write_tuning(out if out is not None else Path(model_dir) / TUNING_NAME, result.tuning)
    echo(f"wrote {path}")
    return path
