"""The conversion report: op counts before/after simplification, file sizes, parity — as tables and JSON.

This is the seed's "Constant 880→169, Cast 91→0, Mod 12→0" table, made automatically for every
conversion and saved as `convert-report.json` in the model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPORT_NAME = "convert-report.json"


@dataclass
class ConvertReport:
    arch: str
    opset: int
    simplifier: str = ""
    # tower -> {"before": {op: n}, "after": {op: n}, "bucket": b} (counted on the first bucket's graph)
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    # tower -> precision -> {op: n} of the final graphs
    final_ops: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    parity: list[dict[str, Any]] = field(default_factory=list)
    top10_overlap: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "opset": self.opset,
            "simplifier": self.simplifier,
            "ops": self.ops,
            "final_ops": self.final_ops,
            "files": self.files,
            "parity": self.parity,
            "top10_overlap": self.top10_overlap,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
        }

    def save(self, directory: Path) -> Path:
        path = Path(directory) / REPORT_NAME
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    def print(self, console: Console) -> None:
        """Op-count, file-size and parity tables."""
        if self.ops:
            towers = list(self.ops)
            table = Table(title=f"Nodes by op type, before → after simplification ({self.simplifier})")
            table.add_column("op")
            for tower in towers:
                table.add_column(f"{tower} b{self.ops[tower].get('bucket', 1)}", justify="right")
            names = sorted(
                {op for t in towers for stage in ("before", "after") for op in self.ops[t][stage]},
                key=lambda op: -max(self.ops[t]["before"].get(op, 0) for t in towers),
            )
            for op in [*names, "total"]:
                cells = []
                for t in towers:
                    before, after = self.ops[t]["before"], self.ops[t]["after"]
                    if op == "total":
                        cells.append(f"{sum(before.values())} → {sum(after.values())}")
                    else:
                        cells.append(f"{before.get(op, 0)} → {after.get(op, 0)}")
                table.add_row(op, *cells)
            console.print(table)
        files = Table(title="Files")
        files.add_column("file")
        files.add_column("MB", justify="right")
        for name, size in sorted(self.files.items()):
            files.add_row(name, f"{size / 1e6:.2f}")
        files.add_row("total", f"{sum(self.files.values()) / 1e6:.2f}")
        console.print(files)
        if self.parity:
            parity = Table(title="Parity against PyTorch (row-wise cosine)")
            for col in ("tower", "precision", "buckets", "min", "mean", "threshold", "ok"):
                parity.add_column(col)
            for r in self.parity:
                parity.add_row(
                    r["tower"] + (f" l{r['length']}" if r.get("length") else ""),
                    r["precision"],
                    ",".join(map(str, r["buckets"])),
                    f"{r['min_cosine']:.6f}",
                    f"{r['mean_cosine']:.6f}",
                    "report only" if r["threshold"] is None else str(r["threshold"]),
                    "yes" if r["passed"] else "NO",
                )
            console.print(parity)
        for precision, overlap in self.top10_overlap.items():
            console.print(f"text→image top-10 neighbour overlap, {precision} vs PyTorch: {overlap:.1%}")
        for note in self.notes:
            console.print(f"[yellow]note:[/yellow] {note}")
