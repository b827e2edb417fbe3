"""`cnclip convert`'s report in the terminal: op counts before → after simplification (the seed's
"Constant 880→169, Cast 91→0, Mod 12→0" table), file sizes and parity, as Rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from retrieval.toolchain.convert.report import ConvertReport


def print_report(report: ConvertReport, console: Console) -> None:
    """Op-count, file-size and parity tables, then the overlaps and notes."""
    """Op-count, file-size and parity tables."""
    if report.ops:
        towers = list(report.ops)
        table = Table(title=f"Nodes by op type, before → after simplification ({report.simplifier})")
        table.add_column("op")
        for tower in towers:
            table.add_column(f"{tower} b{report.ops[tower].get('bucket', 1)}", justify="right")
        names = sorted(
            {op for t in towers for stage in ("before", "after") for op in report.ops[t][stage]},
            key=lambda op: -max(report.ops[t]["before"].get(op, 0) for t in towers),
        )
        for op in [*names, "total"]:
            cells = []
            for t in towers:
                before, after = report.ops[t]["before"], report.ops[t]["after"]
                if op == "total":
                    cells.append(f"{sum(before.values())} → {sum(after.values())}")
                else:
                    cells.append(f"{before.get(op, 0)} → {after.get(op, 0)}")
            table.add_row(op, *cells)
        console.print(table)
    files = Table(title="Files")
    files.add_column("file")
    files.add_column("MB", justify="right")
    for name, size in sorted(report.files.items()):
        files.add_row(name, f"{size / 1e6:.2f}")
    files.add_row("total", f"{sum(report.files.values()) / 1e6:.2f}")
    console.print(files)
    if report.parity:
        parity = Table(title="Parity against PyTorch (row-wise cosine)")
        for col in ("tower", "precision", "buckets", "min", "mean", "threshold", "ok"):
            parity.add_column(col)
        for r in report.parity:
            parity.add_row(
                r["tower"] + (f" l{r['length']}" if r.get("length") else ""),
                r["precision"],
                ",".join(map(str, r["buckets"])),
                f"{r['min_cosine']:.6f}",
                f"{r['mean_cosine']:.6f}",
                "report only" if r["threshold"] is None else str(r["threshold"]),
                "yes" if r["passed"] else "NO",
            )
        console.print(parity)
    for precision, overlap in report.top10_overlap.items():
        console.print(f"text→image top-10 neighbour overlap, {precision} vs PyTorch: {overlap:.1%}")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
