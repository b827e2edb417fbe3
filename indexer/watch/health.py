"""How the served folder watchers are doing, for `/readyz` and `/metrics` (`cnclip serve` with
`CNCLIP_WATCH`).

A watcher's task that fails in a way no pass expects (a bug, an operating-system error nobody
handles) is not left dead behind a green `/healthz`: it is restarted with backoff (1 s, doubling,
at most `BACKOFF_MAX_S`), and until it runs again it is down: `/readyz` answers 503 `watcher_down`
naming it, and `/metrics` shows `cnclip_watcher_up 0` for it. A watcher whose folder is gone,
replaced or unreadable is up (it waits for its folder, as it should); `/metrics` shows that as
`cnclip_watcher_folder_here 0`.
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.errors import CnclipError

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
STEADY_S = 60.0  # a watcher that ran this long before failing starts again from the first backoff


class WatcherDown(CnclipError):
    """A folder watcher of this server is not running (it failed and waits to be restarted)."""

    code = "watcher_down"


@dataclass
class WatcherHealth:
    collection: str
    folder: str
    up: bool = True  # its task runs
    folder_here: bool = True  # its pinned folder is at its path (else it waits for it)
    restarts: int = 0
    reason: str | None = None  # why it is down


class WatchHealth:
    """The served watchers by (folder, collection); also the readiness check of them all."""

    name = "the folder watchers"

    def __init__(self) -> None:
        self.watchers: dict[tuple[str, str], WatcherHealth] = {}

    def add(self, collection: str, folder: str) -> WatcherHealth:
        health = WatcherHealth(collection, folder)
        self.watchers[(folder, collection)] = health
        return health

    def down(self) -> list[WatcherHealth]:
        return [w for w in self.watchers.values() if not w.up]

    async def problem(self) -> CnclipError | None:
        """`/readyz`'s check (api/readiness.py): which watchers are down, and why."""
        down = self.down()
        if not down:
            return None
        return WatcherDown(
            "; ".join(f"the watcher of {w.folder} → {w.collection} is down ({w.reason}); restarting" for w in down)
        )
