"""One line saying which machine a benchmark ran on: CPU model, the SIMD flags that decide int8 speed,
cores and the load average (was it quiet?) — the guide asks for them beside every number."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8")


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    found = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(found.group(1).split()) if found else set()
    return (
        f"{model.group(1) if model else platform.processor()}; {' '.join(f for f in FLAGS if f in flags) or 'no AVX2'}; "
        f"{len(os.sched_getaffinity(0))} cores; load {os.getloadavg()[0]:.2f}"
    )
