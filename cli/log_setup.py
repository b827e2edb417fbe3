"""Where the `cnclip` commands' log records go, and at which level: one rule for every command.

A command's own output is what it prints; log records are the project's chatter (the encoder's
start-up lines, a vector store caught up from SQL). They go to stderr at WARNING, so `cnclip search`
prints its results and nothing else, unless the global `-v` asks for INFO (`-vv`: DEBUG).
`cnclip serve` and `cnclip worker` log at their `--log-level` (INFO by default: their start-up
lines are the point), or lower with `-v`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

# The project's loggers; uvicorn configures only its own.
PROJECT_LOGGERS = ("cnclip", "retrieval", "indexer", "api", "demo")
COMMAND_FORMAT = "%(message)s"
SERVER_FORMAT = "%(levelname)s:     %(name)s: %(message)s"  # uvicorn's


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (a test runner may swap and close it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def verbosity_level(verbose: int) -> int:
    """The logging level of `-v` given `verbose` times: WARNING, INFO, then DEBUG."""
    return logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG


def uvicorn_level(name: str) -> int:
    """A uvicorn `--log-level` name as a logging level (uvicorn's "trace" is below DEBUG)."""
    return logging.DEBUG if name.lower() == "trace" else getattr(logging, name.upper(), logging.INFO)


def configure_logging(level: int, fmt: str = COMMAND_FORMAT) -> None:
    """Send the project's log records at `level` and above to stderr, formatted by `fmt`."""
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        handler = next((h for h in logger.handlers if getattr(h, "_cnclip", False)), None)
        if handler is None:
            handler = _StderrHandler()
            handler._cnclip = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        handler.setFormatter(logging.Formatter(fmt))
