"""One table from the project's errors to exit statuses, the command line's mirror of the API's
`STATUS_BY_ERROR` (api/errors.py), and the one handler that applies it: a project error is one red
`error: …` line on stderr and its status, never a traceback.

The statuses (the README's "Exit status" list says the same): 0 all good; 1 an error (the message
says which); 2 a usage error (a bad option or argument, a bad `CNCLIP_*` value, a model directory a
server cannot use); 3 some files could not be indexed (the others were); 130 interrupted (Ctrl-C);
143 stopped by SIGTERM where a command cleans up first (`cnclip tune`: `sigterm_unwinds`).
"""

from __future__ import annotations

import functools
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer

from retrieval.errors import CnclipError

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")

EXIT_ERROR = 1
EXIT_USAGE = 2  # click's own status for a bad option or argument
EXIT_FILES_FAILED = 3  # the run finished, but some files could not be indexed
EXIT_INTERRUPTED = 130  # Ctrl-C anywhere (the shell's 128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM, where a command unwinds on it (the shell's 128 + SIGTERM)

EXIT_STATUS = (
    "Exit status: 0 all good; 1 an error (the message says which); 2 a usage error (bad option or "
    "argument); 3 some files could not be indexed (the others were); 130 interrupted (Ctrl-C); "
    "143 cnclip tune stopped by SIGTERM."
)


class BadSetting(CnclipError):
    """A `CNCLIP_*` value, or the model directory a server needs, that cannot be used: the
    configuration needs fixing, like a bad option (exit status 2)."""

    code = "bad_setting"


# Project error -> exit status. First matching class wins, so the most specific come first; the
# last row catches every error the project raises on purpose (api/errors.py ends the same way).
EXIT_BY_ERROR: tuple[tuple[type[CnclipError], int], ...] = (
    (BadSetting, EXIT_USAGE),
    (CnclipError, EXIT_ERROR),
)


def exit_status(exc: CnclipError) -> int:
    """The exit status of a project error, from `EXIT_BY_ERROR`."""
    return next(status for cls, status in EXIT_BY_ERROR if isinstance(exc, cls))


def error_line(exc: CnclipError) -> str:
    """The one line a project error is said in (also by a server whose start-up it stopped)."""
    return f"error: {exc.message}"


def fail(exc: CnclipError, *hints: str) -> typer.Exit:
    """Say `exc` in one red line on stderr (and `hints` after it); the `typer.Exit` to raise."""
    typer.secho(error_line(exc), fg=typer.colors.RED, err=True)
    for hint in hints:
        typer.echo(hint, err=True)
    return typer.Exit(exit_status(exc))


def friendly_errors(command: F) -> F:
    """Project errors become one red line and their exit status, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CnclipError as exc:
            raise fail(exc) from None

    return wrapper  # type: ignore[return-value]


class _Terminated(BaseException):
    """Raised by the SIGTERM handler: a BaseException, so no `except Exception` on the way swallows it."""


@contextmanager
def sigterm_unwinds(command: str) -> Iterator[None]:
    """While the block runs, SIGTERM (`kill`, a service manager's stop) unwinds it as Ctrl-C does —
    every `finally` on the way runs: a child process stopped and reaped, a temporary folder removed —
    then one line and EXIT_TERMINATED. Python's own answer to SIGTERM is to die at once, leaving them.
    A second SIGTERM during that clean-up is ignored (kill -9 still ends it; children die with it)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live only there
        yield
        return

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except _Terminated:
        typer.echo(f"{command}: stopped by SIGTERM", err=True)
        raise typer.Exit(EXIT_TERMINATED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


# pydantic-settings names the field, not the variable, when a complex value is not JSON.
_UNPARSED_FIELD = re.compile(r'field "(?P<field>\w+)"')


def read_settings(cls: type[S], **overrides: Any) -> S:
    """`cls(**overrides)` over the `CNCLIP_*` environment, or exit 2 (a usage error) with one red line
    per bad setting — whichever way pydantic fails: a value that does not validate, or a list that is
    not JSON (pydantic-settings raises its own error for that, naming the field)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return cls(**overrides)
    except ValidationError as exc:
        # One line per setting, however many errors pydantic finds in it: one per list item (a list of
        # 10^6 bad items was 10^6 lines) or one per branch of a union (`auto` or a number).
        said: dict[str, list[str]] = {}
        for error in exc.errors():
            head, *rest = error["loc"] or ("",)
            items = ".".join(str(part) for part in rest if isinstance(part, int))
            message = str(error["msg"]).removeprefix("Value error, ")
            said.setdefault("CNCLIP_" + str(head).upper(), []).append(f"item {items}: {message}" if items else message)
        for name, messages in said.items():
            distinct = list(dict.fromkeys(messages))
            joint = "; " if distinct[0].startswith("item ") else "; or "  # list items, or a union's branches
            more = f" (and {len(distinct) - 2:,} more)" if len(distinct) > 2 else ""
            _say(name, joint.join(distinct[:2]) + more)
    except SettingsError as exc:
        match = _UNPARSED_FIELD.search(str(exc))
        name = "CNCLIP_" + match["field"].upper() if match else "a CNCLIP_* setting"
        why = getattr(exc.__cause__, "msg", None)  # the JSON parser's words: "Expecting value", "nested too deeply"
        why = f" ({why})" if isinstance(why, str) else ""
        _say(name, f"is not valid JSON{why} (lists are written as JSON, e.g. '[1,8,16]'; see docs/settings.md)")
    raise typer.Exit(EXIT_USAGE)


def _say(name: str, message: str) -> None:
    typer.secho(f"error: {name}: {message}", fg=typer.colors.RED, err=True)
