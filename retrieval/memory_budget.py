"""How much memory the towers' weight copies may take: the one rule the tuner and the runtime share.
(The tuner charges each configuration what its sessions took on this machine, retrieval/toolchain/tune/memory.py;
the runtime, which has only the files, estimates from their size.)

A tower's sessions either share one weight copy (ONNX Runtime on the CPU, prepacking off) or hold a
copy each (a prepacked ONNX Runtime session, an OpenVINO compiled model: on the CPU one per stream,
which every bucket of the tower shares; elsewhere one per bucket). Nine prepacked copies of
ViT-B-16 took `cnclip serve` from 384 MB to 1.44 GB for 1.1–1.4× speed on an AVX2 CPU (BENCHMARKS.md,
issue 24), so the copies are bounded by default:

- `auto` (the default): one copy of each tower plus `AUTO_EXTRA_MB` for copies beyond it — the rest
  of a serving process (interpreter, engines, arenas, the catalog) took ~200 MB, so the process stays
  within the weights + 600 MB the issue asks for. A tuning file brings the budget it was made with
  (auto resolved to a number there; 0 when tuned without one): the choice was measured within it.
- a number of MB: that bound, strictly (start-up fails in one line when even shared copies exceed it);
- `0`: no bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from retrieval.errors import InvalidInput

AUTO_EXTRA_MB = 400
BudgetSetting = Literal["auto"] | int


@dataclass(frozen=True)
class Budget:
    mb: int  # 0: no bound
    strict: bool  # an explicit number: exceeding it is an error; auto only ever drops copies
    source: str  # for log lines: "CNCLIP_MEMORY_BUDGET_MB=…", "auto", "the tuning file's"

    def allows(self, need_mb: float) -> bool:
        return self.mb <= 0 or need_mb <= self.mb


def parse_budget(text: str) -> BudgetSetting:
    """`auto` or a whole number of MB ≥ 0 (the CLI's --memory-budget-mb)."""
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    if not value.isascii() or not value.isdigit() or len(value) > 9:
        raise InvalidInput(f"the memory budget must be auto or a whole number of MB, not {text!r}")
    return int(value)


def resolve_budget(setting: BudgetSetting, one_copy_mb: float, tuned_mb: int | None = None) -> Budget:
    """The bound in force: `setting` as given, or for `auto` the tuning file's (`tuned_mb`, None
    without one) or one copy of each tower (`one_copy_mb`, summed) + AUTO_EXTRA_MB."""
    if setting != "auto":
        return Budget(int(setting), strict=True, source=f"{setting} MB")
    if tuned_mb is not None:
        return Budget(tuned_mb, strict=False, source=f"the tuning file's {tuned_mb or 'unbounded'} MB")
    mb = math.ceil(one_copy_mb) + AUTO_EXTRA_MB
    return Budget(mb, strict=False, source=f"auto: the weights ({one_copy_mb:.0f} MB) + {AUTO_EXTRA_MB} MB")
