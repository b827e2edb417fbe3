"""Whether the catalog's database answers, as `/readyz` needs it: cheap under any probe rate.

A load balancer may ask `/readyz` many times a second on every replica. The database is asked (one
indexed read, `SqlCatalog.ping`, in a worker thread) at most once per `interval_s`; answers in
between come from the last result, and concurrent callers share the one ping in flight. A ping that
hangs (a blackholed host) is not waited on past `timeout_s`: the answer is "down" until it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from api.blocking import run_blocking
from retrieval.errors import CnclipError

log = logging.getLogger("cnclip.api")


class DatabaseProbe:
    """A cached, rate-limited `ping()` of the database; `ping` raises a `CnclipError` when it is down."""

    def __init__(self, ping: Callable[[], None], interval_s: float, timeout_s: float = 5.0) -> None:
        self._ping = ping
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._up = False
        self._checked_at: float | None = None  # monotonic time of the last finished ping
        self._in_flight: asyncio.Task[bool] | None = None

    async def up(self) -> bool:
        """The database's state, at most `interval_s` old."""
        if self._checked_at is not None and time.monotonic() - self._checked_at < self.interval_s:
            return self._up
        if self._in_flight is None:
            self._in_flight = asyncio.ensure_future(self._check())
        try:
            return await asyncio.wait_for(asyncio.shield(self._in_flight), self.timeout_s)
        except TimeoutError:
            return False  # the ping runs on; whoever asks after it finishes gets its answer

    async def _check(self) -> bool:
        try:
            await run_blocking(self._ping)
            up = True
        except CnclipError as exc:
            up = False
            if self._up or self._checked_at is None:
                log.warning("readiness: the database does not answer: %s", exc.message)
        finally:
            self._in_flight = None  # also after a bug in ping: the next caller pings afresh
        if up and not self._up and self._checked_at is not None:
            log.info("readiness: the database answers again")
        self._up, self._checked_at = up, time.monotonic()
        return up
