"""CLI commands of this package (see api/cli.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""
