"""What `/readyz` asks beyond "started": a list of named checks (the database answers, a remote encoder
answers), each cheap under any probe rate.

A load balancer may ask `/readyz` many times a second on every replica. Each `Probe` runs its check
(the database: one indexed read, `SqlCatalog.ping`, in a worker thread; a remote encoder: its
server's model-readiness routes, `TritonEncoder.check_health`) at most once per `interval_s`; answers
in between come from the last result, and concurrent callers share the one check in flight. A check
that hangs (a blackholed host) is not waited on past `timeout_s`: the answer is "down" until it
returns. Another part of the server adds its own check with `Readiness.add`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from api.blocking import run_blocking
from indexer.errors import DatabaseUnavailable
from retrieval.errors import CnclipError, EncoderUnavailable

log = logging.getLogger("cnclip.api")


class ReadinessCheck(Protocol):
    """One named condition of readiness."""

    name: str

    async def problem(self) -> CnclipError | None:
        """None when ready, else the error `/readyz` answers with (its status decides the 503)."""


class Probe:
    """A cached, rate-limited async `check()`, which raises a `CnclipError` while `name` is not ready;
    `down(reason)` is the error `/readyz` answers with then."""

    def __init__(
        self,
        name: str,
        check: Callable[[], Awaitable[None]],
        down: Callable[[str], CnclipError],
        interval_s: float,
        timeout_s: float = 5.0,
    ) -> None:
        self.name = name
        self._check_fn = check
        self._down = down
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._reason: str | None = None  # why it is not ready, from the last finished check
        self._checked_at: float | None = None  # monotonic time of the last finished check
        self._in_flight: asyncio.Task[str | None] | None = None

    async def up(self) -> bool:
        """Whether `name` is ready, at most `interval_s` old."""
        return await self.problem() is None

    async def problem(self) -> CnclipError | None:
        """None while ready, else a fresh error to answer with; at most `interval_s` old."""
        if self._checked_at is not None and time.monotonic() - self._checked_at < self.interval_s:
            reason = self._reason
        else:
            if self._in_flight is None:
                self._in_flight = asyncio.ensure_future(self._check())
            try:
                reason = await asyncio.wait_for(asyncio.shield(self._in_flight), self.timeout_s)
            except TimeoutError:  # the check runs on; whoever asks after it finishes gets its answer
                reason = f"no answer within {self.timeout_s:g} s"
        return None if reason is None else self._down(f"{self.name}: {reason}")

    async def _check(self) -> str | None:
        was_up = self._checked_at is not None and self._reason is None
        reason: str | None = None
        try:
            await self._check_fn()
        except CnclipError as exc:
            reason = exc.message
            if was_up or self._checked_at is None:
                log.warning("readiness: %s: %s", self.name, reason)
        finally:
            self._in_flight = None  # also after a bug in the check: the next caller checks afresh
        if reason is None and not was_up and self._checked_at is not None:
            log.info("readiness: %s answers again", self.name)
        self._reason, self._checked_at = reason, time.monotonic()
        return reason


class Readiness:
    """The named checks `/readyz` runs (concurrently); the first problem, in the order added, wins."""

    def __init__(self) -> None:
        self.checks: list[ReadinessCheck] = []

    def add(self, check: ReadinessCheck) -> None:
        self.checks.append(check)

    async def problem(self) -> CnclipError | None:
        problems = await asyncio.gather(*(check.problem() for check in self.checks))
        return next((p for p in problems if p is not None), None)


def database_probe(ping: Callable[[], None], interval_s: float, timeout_s: float = 5.0) -> Probe:
    """The catalog's database: `ping` (blocking, raises a `CnclipError` when it is down) in a worker thread."""

    async def check() -> None:
        await run_blocking(ping)

    return Probe("the database", check, DatabaseUnavailable, interval_s, timeout_s)


def encoder_probe(model_id: str, check_health: Callable[[], Awaitable[None]], interval_s: float) -> Probe:
    """A remote encoder: its own bounded health check (`check_health` raises `EncoderUnavailable`)."""
    return Probe(f"the remote encoder of {model_id}", check_health, EncoderUnavailable, interval_s)
