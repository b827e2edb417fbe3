"""A deadline between the batches a Ray cluster sends back (indexer/bulk/cluster/ray_session.py).

Ray redoes the work of a lost node where it can; where it cannot (the remaining nodes have no room
for the stage that waits: measured with a node removed from a two-node cluster on this machine), the
job waits for ever. A run whose cluster sends nothing for `stall_s` seconds, once the first batch came
(before it, the actors load the model, which takes as long as it takes), fails instead; what it
committed stays and the same command resumes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

STALL_S = 180.0  # a batch of a large model on a slow CPU takes seconds, not minutes


class Stalled(Exception):
    """Nothing came for `stall_s` seconds."""


def with_deadline(items: Iterator[T], stall_s: float = STALL_S) -> Iterator[T]:
    """`items`, pulled by a thread of their own; `Stalled` when, after the first, the next takes longer
    than `stall_s`. An exception of `items` is raised here, in the caller's thread."""
    handoff: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def pull() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        handoff.put(("item", item), timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handoff.put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            handoff.put(("error", exc))

    threading.Thread(target=pull, name="cnclip-ray-results", daemon=True).start()
    first = True
    try:
        while True:
            try:
                kind, payload = handoff.get(timeout=None if first else stall_s)
            except queue.Empty:
                raise Stalled(f"nothing came back from the cluster for {stall_s:.0f} s") from None
            if kind == "end":
                return
            if kind == "error":
                raise payload  # type: ignore[misc]
            first = False
            yield payload  # type: ignore[misc]
    finally:
        stop.set()
