"""Whether the tuner's numbers can be trusted: enough calls per case, and a look at the load.

A tuning file made during a load spike measured image b1 prepacking at 0.39× the shared session
where a quiet machine gave 1.09×, and batched image shapes got 1–2 calls per round (issue 34). So:

- **Calls per case** (`sample_calls`): after one warm-up call, calls until at least `MIN_CALLS` ran,
  the case had its time, and the relative spread (interquartile range ÷ median) is within
  `SPREAD_BOUND` — or the case's cap of time is spent (then it counts as noisy).
- **Other work** (`CpuWatch`): the CPU time the machine spent on the cores this process may use
  (/proc/stat, per core) minus this process's own (/proc/self/stat), per second of wall time: the
  cores' worth of other processes beside the measurement. The load average is reported beside it,
  but does not decide: it still counts the tuner's own previous minute (its quality gate runs on
  every core), so a second tune right after a first would read as busy.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

MIN_CALLS = 5  # a median and a quartile spread need a few calls, however slow each is
SPREAD_BOUND = 0.10  # interquartile range ÷ median of a case's calls: above it the case is noisy
CAP_FACTOR = 4.0  # a noisy case keeps calling for up to this many times its time
MAX_CALLS = 2000  # a microsecond-fast case stops here
# Other processes using this much of a core on average (on our cores) compete with the measurement.
OTHER_WORK_CORES = 0.3
NOISY_SHARE = 0.25  # more than this share of noisy cases makes the whole measurement noisy


@dataclass(frozen=True)
class CallStats:
    """One case: the median ms of a call, the relative spread of the calls, how many ran."""

    ms: float
    spread: float
    calls: int

    @property
    def noisy(self) -> bool:
        return self.spread > SPREAD_BOUND


def relative_spread(times: list[float]) -> float:
    """Interquartile range ÷ median (0.0 for fewer than two values)."""
    if len(times) < 2:
        return 0.0
    quartiles = statistics.quantiles(times, n=4, method="inclusive")
    median = statistics.median(times)
    return (quartiles[2] - quartiles[0]) / median if median > 0 else 0.0


def sample_calls(run: Callable[[], object], seconds: float, min_calls: int = MIN_CALLS) -> CallStats:
    """Time `run` back to back (one warm-up call first) until `min_calls` ran, `seconds` passed and
    the spread is within SPREAD_BOUND; or until CAP_FACTOR × `seconds` (never fewer than `min_calls`)."""
    run()
    times: list[float] = []
    began = time.perf_counter()
    cap = began + CAP_FACTOR * seconds
    while len(times) < MAX_CALLS:
        start = time.perf_counter()
        run()
        end = time.perf_counter()
        times.append(end - start)
        if len(times) < min_calls:
            continue
        if end >= cap or (end - began >= seconds and relative_spread(times) <= SPREAD_BOUND):
            break
    return CallStats(statistics.median(times) * 1000, relative_spread(times), len(times))


def _ticks_on(cores: set[int]) -> int:
    """Busy clock ticks of `cores` since boot (user, nice, system, irq, softirq, steal)."""
    total = 0
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in values[:8])
                total += user + nice + system + irq + softirq + steal
    return total


def _own_ticks() -> int:
    """This process's user + system clock ticks (all its threads)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


class CpuWatch:
    """Other processes' CPU on our cores between `start()` and `stop()`, in cores (0.0 where /proc is
    missing: nothing is known, nothing is claimed)."""

    def __init__(self, cores: list[int]) -> None:
        self.cores = set(cores)
        self._began: tuple[float, int, int] | None = None

    def start(self) -> None:
        try:
            self._began = (time.monotonic(), _ticks_on(self.cores), _own_ticks())
        except (OSError, ValueError, IndexError):
            self._began = None

    def stop(self) -> float:
        if self._began is None:
            return 0.0
        began, busy, own = self._began
        try:
            busy_now, own_now = _ticks_on(self.cores), _own_ticks()
        except (OSError, ValueError, IndexError):
            return 0.0
        wall = max(time.monotonic() - began, 1e-3)
        others = (busy_now - busy) - (own_now - own)
        return max(0.0, others / os.sysconf("SC_CLK_TCK") / wall)


def others_now(cores: list[int], seconds: float = 1.0) -> float:
    """Other processes' CPU on our cores over the next `seconds` (this process idle meanwhile)."""
    watch = CpuWatch(cores)
    watch.start()
    time.sleep(seconds)
    return watch.stop()


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def others_competed(other_cores: float) -> bool:
    """Whether other processes used enough of our cores to compete with the measurement."""
    return other_cores >= OTHER_WORK_CORES


def noise_reason(other_cores: float, noisy_cases: int, cases: int, load: float, cores: int) -> str | None:
    """Why a measurement cannot be trusted (None: it can)."""
    reasons = []
    if others_competed(other_cores):
        reasons.append(f"other processes used {other_cores:.1f} of {cores} cores while it measured")
    if cases and noisy_cases > NOISY_SHARE * cases:
        varied = f"{noisy_cases} of {cases} cases varied more than {SPREAD_BOUND:.0%} between calls"
        if not others_competed(other_cores):
            # Nothing here competed, and the calls still varied: on a quiet AVX2 EPYC VM half the cases
            # did, other processes 0.03 cores (issue 34). Say so: waiting for a quiet machine won't help.
            varied += (
                f", though other processes used only {other_cores:.2f} of {cores} cores"
                " (the host itself varies: a VM's neighbours, the CPU's clock)"
            )
        reasons.append(varied)
    if reasons:
        # Read before the tuner's own work: later it counts the tuner's last minute (see above).
        reasons.append(f"load average {load:.1f} when tune started")
    return "; ".join(reasons) or None
