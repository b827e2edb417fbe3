"""What the commands print: plain text columns for the listings (`cnclip models list`, `cnclip stats`),
and plurals.

Never cut and never wrapped, whatever the terminal's width or none (a pipe): a URL or a model id
that a listing prints is one that can be copied. Widths count terminal cells, so Chinese names line
up too.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len

GAP = "  "


def plain_columns(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """The lines of a left-aligned table: `header`, then one line per row (values as `str`)."""
    table = [[str(v) for v in header], *([str(v) for v in row] for row in rows)]
    widths = [max(cell_len(line[i]) for line in table) for i in range(len(header))]
    return [
        GAP.join(value + " " * (width - cell_len(value)) for value, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, plural but for 1: "1 image", "0 images", "2 images"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
