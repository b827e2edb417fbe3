"""The conversion report: op counts before/after simplification, file sizes, parity — as JSON here,
as tables in the terminal (cli/convert_report.py).

This is the seed's "Constant 880→169, Cast 91→0, Mod 12→0" table, made automatically for every
conversion and saved as `convert-report.json` in the model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
