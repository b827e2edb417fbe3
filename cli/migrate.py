"""`cnclip migrate`: move a collection to another model without downtime (docs/migrate.md). One action
per run: `--model DIR` re-embeds into a shadow generation and swaps once it covers every item and the
probe passes (unless `--no-swap`); `--status`, `--swap`, `--rollback`, `--drop-old` and `--drop-shadow`
act on the generations the collection has. Searches keep using the active generation throughout."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.errors import friendly_errors

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.generations import Generation, MigrationStatus
    from indexer.service.collections import CollectionService
    from indexer.service.migration import MigrateOptions, MigrateReport

ACTIONS = ("status", "swap", "rollback", "drop_old", "drop_shadow")


def migrate(
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to migrate.")],
    model: Annotated[
        Path | None, typer.Option("--model", "-m", help="Model directory of the new model (manifest.json).")
    ] = None,
    status: Annotated[bool, typer.Option("--status", help="Show the generations and the shadow's coverage.")] = False,
    swap: Annotated[
        bool, typer.Option("--swap", help="Make the shadow generation active (coverage must be full).")
    ] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Make the previous generation active again.")] = False,
    drop_old: Annotated[
        bool, typer.Option("--drop-old", help="Forget the previous generation (no rollback after).")
    ] = False,
    drop_shadow: Annotated[bool, typer.Option("--drop-shadow", help="Abandon the migration in progress.")] = False,
    no_swap: Annotated[bool, typer.Option("--no-swap", help="Fill the shadow only; swap later with --swap.")] = False,
    throttle: Annotated[
        float, typer.Option(min=0.0, max=1e6, help="Most items embedded per second (0: no cap).")
    ] = 0.0,
    batch: Annotated[int, typer.Option(min=1, max=1024, help="Items per encoder call.")] = 32,
    prune_missing: Annotated[
        bool, typer.Option("--prune-missing", help="Prune items whose files are gone or changed instead of stopping.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Re-embed a collection with another model while searches go on, then swap atomically."""
    from cli.catalog import storage_settings
    from cli.serving import exit_on_bad_model_dir
    from indexer.domain.names import check_collection_name
    from indexer.service.migration import MigrateOptions

    check_collection_name(collection)
    chosen = [name for name, on in zip(ACTIONS, (status, swap, rollback, drop_old, drop_shadow), strict=True) if on]
    if len(chosen) + (model is not None) != 1:  # a usage error: click's own line and status 2
        raise typer.BadParameter(
            "give exactly one of --model DIR, --status, --swap, --rollback, --drop-old, --drop-shadow"
        )
    options = MigrateOptions(batch=batch, throttle=throttle, swap=not no_swap, prune_missing=prune_missing)
    action = chosen[0] if chosen else "migrate"
    settings = storage_settings()
    if model is not None:  # the whole directory checked, in one line, before the collection is touched
        exit_on_bad_model_dir(settings, "--model", model)
    lines = asyncio.run(_run(settings, collection, action, model, options, as_json))
    typer.echo("\n".join(lines))


async def _run(
    settings: StorageSettings, collection: str, action: str, model: Path | None, options: MigrateOptions, as_json: bool
) -> list[str]:
    from indexer.runtime import open_runtime

    async with open_runtime(settings, encoder=False) as rt:
        service = rt.service
        assert service is not None
        before = await asyncio.to_thread(service.migration.status, collection)  # an unknown collection: one line
        if action == "migrate":
            assert model is not None
            report = await _migrate(settings, service, collection, model, options)
            return [_report_json(report)] if as_json else _report_lines(report)
        if action == "swap":
            await asyncio.to_thread(service.migration.swap, collection)
        elif action == "rollback":
            await asyncio.to_thread(service.migration.rollback, collection)
        elif action in ("drop_old", "drop_shadow"):
            role = "previous" if action == "drop_old" else "shadow"
            await asyncio.to_thread(service.migration.drop_generation, collection, role)
        after = before if action == "status" else await asyncio.to_thread(service.migration.status, collection)
        return [json.dumps(status_json(after), ensure_ascii=False)] if as_json else status_lines(after)


async def _migrate(
    settings: StorageSettings, service: CollectionService, collection: str, model: Path, options: MigrateOptions
) -> MigrateReport:
    from cli.progress import rebuild_progress
    from indexer.runtime import model_encoder

    encoder = await asyncio.to_thread(model_encoder, settings, model)
    try:
        await asyncio.to_thread(service.migration.check_migration, collection, encoder)  # one line, before the bar
        with rebuild_progress(collection) as update:
            # The directory, absolute, is recorded for servers that meet the swap (indexer/service/model_loader.py).
            return await service.migration.migrate(collection, encoder, options, update, os.path.abspath(model))  # type: ignore[no-any-return]
    finally:
        await encoder.close()


def _generation_json(generation: Generation | None) -> dict[str, Any] | None:
    if generation is None:
        return None
    return {
        "number": generation.number,
        "model": generation.model,
        "dim": generation.dim,
        "vectors": generation.vectors,
        "swapped_at": generation.swapped_at.isoformat() if generation.swapped_at else None,
    }


def status_json(status: MigrationStatus) -> dict[str, Any]:
    return {
        "collection": status.collection,
        "items": status.items,
        "active": _generation_json(status.active),
        "shadow": _generation_json(status.shadow),
        "previous": _generation_json(status.previous),
        "coverage": round(status.coverage, 6),
        "missing": status.missing,
    }


def status_lines(status: MigrationStatus) -> list[str]:
    lines = [f"collection {status.collection}: {status.items} items"]
    for role, generation in (("active", status.active), ("shadow", status.shadow), ("previous", status.previous)):
        if generation is None:
            lines.append(f"  {role:<8}  -")
            continue
        share = f" ({100 * generation.vectors / status.items:.1f} %)" if status.items and role == "shadow" else ""
        lines.append(
            f"  {role:<8}  generation {generation.number}  {generation.model} ({generation.dim}-d)  "
            f"{generation.vectors} vectors{share}"
        )
    return lines


def _report_json(report: MigrateReport) -> str:
    probe = report.probe.__dict__ | {"passed": report.probe.passed} if report.probe is not None else None
    summary = {
        "embedded": report.embedded,
        "pruned": report.pruned,
        "seconds": round(report.seconds, 3),
        "items_per_s": round(report.items_per_s, 2),
        "swapped": report.swapped,
        "prepared": report.prepared,
        "probe": probe,
        "status": status_json(report.status),
    }
    return json.dumps(summary, ensure_ascii=False)


def _report_lines(report: MigrateReport) -> list[str]:
    lines = [f"embedded {report.embedded} items in {report.seconds:.1f} s ({report.items_per_s:.1f} items/s)"]
    if report.pruned:
        lines.append(f"pruned {report.pruned} items whose files are gone or changed")
    if report.probe is not None:
        probe = report.probe
        lines.append(
            f"probe: {probe.found_self}/{probe.sampled} sampled items find themselves, agreement "
            f"{probe.agreement:.4f}, text hits {probe.text_hits}"
        )
    if report.swapped:
        lines.append("swapped: the new model answers searches now")
    elif report.status.shadow is None:
        lines.append("not swapped by this run: another run swapped the shadow in, or dropped it")
    else:
        lines.append("not swapped (--swap later)")
    return lines + status_lines(report.status)


def register(app: typer.Typer) -> None:
    """`cnclip migrate`."""
    app.command("migrate")(friendly_errors(migrate))
