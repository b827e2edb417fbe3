"""`cnclip convert`'s last step: the quality gate for every engine × run precision, recorded in the manifest.

After the PyTorch parity check, every usable backend (retrieval/backends/) runs every precision it
offers for each tower, judged against the fp32 graphs (retrieval/toolchain/gate.py). The results go into the
manifest's `extra.gate` (the runtime never picks what failed there). A tower's calibrated int8
(`int8-qdq`) graphs that no engine passes are removed from the model directory: refused, not
shipped. ONNX Runtime's own int8/fp16 graphs stay (they always shipped), but a failure recorded for
them keeps `auto` off them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from retrieval.backends import DEFAULT_BACKEND
from retrieval.manifest import ModelManifest, TowerSpec
from retrieval.toolchain.convert.report import ConvertReport
from retrieval.toolchain.gate import Candidate, GateResult, gate_record, run_gate
from retrieval.toolchain.tune.tuner import candidates
from retrieval.tuning import machine_fingerprint

REFUSABLE = ("int8-qdq",)  # graph variants that are dropped when no engine passes them


def gate_engines(
    manifest: ModelManifest, out: Path, report: ConvertReport, progress: Callable[[str], None]
) -> ModelManifest:
    """Run the gate, record it, drop refused int8-qdq graphs; returns the saved manifest."""
    progress("quality gate: every engine × precision")
    found, skipped = candidates(manifest, ())
    reference = Candidate(DEFAULT_BACKEND, DEFAULT_BACKEND.host_device, "fp32", "fp32")
    results = run_gate(manifest, found, sorted(os.sched_getaffinity(0)), reference)
    report.notes += [f"gate: {r.line()}" for r in results] + [f"gate skipped {s}" for s in skipped]
    by_graph: dict[tuple[str, str], list[GateResult]] = {}
    for tower, options in found.items():
        for candidate in options:
            result = next(r for r in results if r.key == (candidate.backend.name, candidate.precision, tower))
            by_graph.setdefault((tower, candidate.graph), []).append(result)
    refused = {
        (tower, graph)
        for (tower, graph), rs in by_graph.items()
        if graph in REFUSABLE and not any(r.passed for r in rs)
    }
    towers = dict(manifest.towers)
    removed: list[str] = []
    for tower, graph in sorted(refused):
        spec = towers[tower]
        names = [f for g in spec.graphs[graph].values() for f in [g]]
        names += [f for by_len in spec.short_graphs.get(graph, {}).values() for f in by_len.values()]
        removed += names + [f"{tower}.{graph}.data"]
        towers[tower] = TowerSpec(
            spec.input_name,
            spec.output_name,
            {p: g for p, g in spec.graphs.items() if p != graph},
            {p: g for p, g in spec.short_graphs.items() if p != graph},
        )
        report.notes.append(f"{tower} {graph} graphs refused by the gate and removed")
    for name in removed:
        (out / name).unlink(missing_ok=True)
    extra = {**manifest.extra, "gate": gate_record(results, machine_fingerprint())}
    files = {n: h for n, h in manifest.files.items() if n not in removed}
    kept = dataclasses.replace(manifest, towers=towers, extra=extra, files=files)
    return kept.save(out)
