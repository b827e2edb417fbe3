"""Child processes that never outlive the command that started them.

A command that starts a server for itself (`cnclip tune`'s validation worker, `cnclip triton-server`'s
tritonserver) stops it in its own clean-up; a command killed outright (kill -9, an OOM kill, a
SIGTERM that Python does not turn into clean-up) runs none. Linux's parent-death signal covers those:
the kernel sends the child SIGTERM when its parent dies, however it dies, so no orphan keeps a port,
gigabytes of model and the cores. Elsewhere there is no such request and only the clean-up stops it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _linux_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


# Looked up here, in the parent: between fork and exec the child only calls it (a dlsym there could
# wait for a lock another of the parent's threads held when it forked).
_PRCTL = _linux_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that has the child SIGTERMed when this process dies (None
    where the platform cannot). Start long-lived children from a thread that lives as long as the
    process (the main thread): Linux sends the signal when the forking *thread* ends."""
    if _PRCTL is None:
        return None
    prctl, parent, sigterm = _PRCTL, os.getpid(), int(signal.SIGTERM)

    def in_child() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:  # the parent died before the request took hold: no signal will come
            os._exit(1)

    return in_child
