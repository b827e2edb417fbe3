"""`cnclip index --ray ADDRESS` and `--json`: which indexer a run uses, and its one-line JSON summary.

Ray is imported only by a run with `--ray` (indexer/bulk/cluster/ray_session.py): `cnclip serve` and a
plain `cnclip index` never load it (tests/system/test_ray_cluster.py checks both).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from indexer.bulk.pipeline import ImageIndexer
    from indexer.domain.index_summary import IndexSummary


def cluster_options(
    address: str | None, *, watching: bool, shards: tuple[int | None, int | None] = (None, None)
) -> dict[str, Any]:
    """The indexer's options for `--ray ADDRESS`, checked before anything opens: Ray installed (else one
    line naming the extra), and no --watch beside it; `shards`: `--shard-threshold` and `--shard-rows`,
    when given (indexer/bulk/cluster/shards.py has the defaults), only with `--ray`."""
    from indexer.bulk.cluster.ray_session import import_ray
    from retrieval.errors import InvalidInput

    if address is None:
        raise InvalidInput("--shard-threshold and --shard-rows go with --ray")
    if watching:
        raise InvalidInput("--ray indexes once: it does not combine with --watch")
    import_ray()
    options: dict[str, Any] = {"address": address}
    for name, value in zip(("shard_threshold", "shard_rows"), shards, strict=True):
        if value is not None:
            options[name] = value
    return options


def indexer_class(options: dict[str, Any]) -> type[ImageIndexer]:
    """The cluster's indexer when the options name a Ray address, else the local one."""
    if "address" in options:
        from indexer.bulk.cluster.indexer import ClusterIndexer

        return ClusterIndexer
    from indexer.bulk.pipeline import ImageIndexer

    return ImageIndexer


def run_details(indexer: ImageIndexer, summary: IndexSummary) -> dict[str, Any]:
    """`nodes` (that embedded something), `per_node` (images and rates of each Ray node of a `--ray` run,
    or of this machine) and, for `--ray`, `commit_rows_per_s` (the driver's commits into the catalog),
    `shards` (Parquet shards committed) and `shards_discarded` (uncommitted ones a killed run left)."""
    work = getattr(indexer, "nodes", None)
    if work is not None:
        nodes = work.rates(summary.seconds)
        committer = round(work.committed / work.commit_s, 1) if work.commit_s else 0.0
        shards = {"shards": work.shards, "shards_discarded": work.shards_discarded}
        return {"nodes": len(nodes), "per_node": nodes, "commit_rows_per_s": committer, **shards}
    if not summary.embedded:
        return {"nodes": 0, "per_node": {}}
    rate = round(summary.embedded / summary.seconds, 2) if summary.seconds else 0.0
    here = {"images": summary.embedded, "images_per_s": rate, "busy_images_per_s": rate}
    return {"nodes": 1, "per_node": {platform.node() or "local": here}}


def json_summary(summary: IndexSummary, details: dict[str, Any], bad_files: Path | None) -> str:
    """The `--json` line: `indexed` (new and changed files embedded), `skipped`, `failed`, `seconds`,
    `images_per_s` (embedded per second of the run), `stages` (where its time went, docs/indexing.md),
    the run's `details` (`nodes`, `per_node`, ...), the summary line's other counts and `report` (the
    bad files' JSONL, or null)."""
    return json.dumps(
        {
            "indexed": summary.added + summary.changed,
            "added": summary.added,
            "changed": summary.changed,
            "renamed": summary.renamed,
            "skipped": summary.skipped,
            "unchanged": summary.unchanged,
            "duplicates": summary.duplicates,
            "not_images": summary.not_images,
            "failed": len(summary.failures),
            "pruned": summary.pruned,
            "read_for_text": summary.read_for_text,
            "interrupted": summary.interrupted,
            "seconds": round(summary.seconds, 3),
            "images_per_s": round(summary.embedded / summary.seconds, 2) if summary.seconds else 0.0,
            "stages": summary.stages.rounded(),  # seconds per stage; they overlap (docs/indexing.md)
            **details,
            "report": str(bad_files) if bad_files is not None else None,
        }
    )
