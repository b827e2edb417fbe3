"""`cnclip index --ray ADDRESS`: the bulk pipeline (indexer/bulk/pipeline.py) with its read and embed
stages on a Ray cluster.

The driver (this process) plans exactly as a local run does — the same `ImageIndexer` planning, the
same SQL: new, changed and touched files, moves by content, remembered deletions, the date and hash
backfills, copies, the prune — and only the files a local run would read go to the cluster. There
Ray Data reads, hashes, decodes and preprocesses them in tasks and embeds them in one actor per node
(indexer/bulk/cluster/ray_session.py, node_stages.py). The results stream back to the driver, which
routes each file as a local run does (indexer/bulk/routing.py: new bytes are added, known bytes
become a path update or a duplicate) and commits every `batch_size` images through the collection
service: one transaction each, SQL rows and vectors together.

Above `shard_threshold` files to read, the results are written as Parquet shards of `shard_rows` rows
instead, each loaded by the committer in one transaction through the service's bulk load (PostgreSQL
COPY) and marked done by a manifest (indexer/bulk/cluster/shards.py).

Exact and resumable: a killed driver or node loses at most the batches (shards) not yet committed; a
rerun plans again from the catalog, so what was committed is unchanged (not read again) or known
bytes (not embedded again) — nothing is committed twice. Bad files are counted and reported as in a
local run (the same reader and preprocessing code, run on the node).
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexer.bulk.cluster.ray_session import RaySession, encode_job
from indexer.bulk.cluster.shards import SHARD_ROWS, SHARD_THRESHOLD, ShardLog, discard_left, read_shard
from indexer.bulk.pipeline import ImageIndexer, IndexRun, Todo
from indexer.bulk.reading import PreparedFile
from indexer.bulk.routing import FileRouter
from indexer.config import StorageSettings
from indexer.domain.index_summary import IndexSummary
from indexer.service.collections import CollectionService
from retrieval.errors import InvalidInput


@dataclass
class NodeWork:
    """What the cluster's nodes embedded in one run: images and busy seconds per Ray node id."""

    images: Counter[str] = field(default_factory=Counter)
    busy_s: dict[str, float] = field(default_factory=dict)
    committed: int = 0  # rows the driver committed, in `commit_s` seconds (the committer's rate)
    commit_s: float = 0.0
    shards: int = 0  # Parquet shards committed (a run above the shard threshold)
    shards_discarded: int = 0  # uncommitted shards an earlier, killed run left (planned again)

    def add(self, node: str, seconds: float) -> None:
        self.images[node] += 1
        self.busy_s[node] = self.busy_s.get(node, 0.0) + seconds

    def rates(self, wall_s: float) -> dict[str, dict[str, float]]:
        """Per node: images embedded, images/s over the run and images/s while embedding."""
        return {
            node: {
                "images": count,
                "images_per_s": round(count / wall_s, 2) if wall_s else 0.0,
                "busy_images_per_s": round(count / self.busy_s[node], 2) if self.busy_s[node] else 0.0,
            }
            for node, count in sorted(self.images.items())
        }


class ClusterIndexer(ImageIndexer):
    """An `ImageIndexer` whose read → embed stage runs on the Ray cluster at `address`. The driver
    needs no model of its own: the nodes load it from the model directory of the collection's
    encoder (the same path on every node)."""

    def __init__(
        self,
        service: Any,
        collection: str,
        *,
        address: str,
        shard_threshold: int = SHARD_THRESHOLD,
        shard_rows: int = SHARD_ROWS,
        shard_dir: Path | None = None,
        **options: Any,
    ) -> None:
        super().__init__(service, collection, **options)
        self.address = address
        self.nodes = NodeWork()
        self.shard_threshold = shard_threshold
        self.shard_rows = shard_rows
        self.shard_dir = shard_dir  # None: never through shards

    @classmethod
    def from_settings(
        cls, settings: StorageSettings, service: CollectionService, collection: str, **options: Any
    ) -> ImageIndexer:
        """As `ImageIndexer.from_settings`, with the shards under the data dir's `shards/`."""
        options.setdefault("shard_dir", settings.data_dir / "shards")
        return super().from_settings(settings, service, collection, **options)

    def _node_settings(self, run: IndexRun) -> Any:
        """The settings the nodes build their encoders from: the collection's model, run locally."""
        settings = getattr(self.encoder(run), "settings", None)
        if settings is None or not hasattr(settings, "model_dir"):
            raise InvalidInput("--ray embeds with the model's files on each node: use a local model (CNCLIP_MODEL_DIR)")
        return settings.model_copy(update={"encoder": "local"})

    async def _index(self, run: IndexRun, todo: Todo) -> None:
        if self.shard_dir is not None:  # what a killed run left: planned again (indexer/bulk/cluster/shards.py)
            self.nodes.shards_discarded = discard_left(self.shard_dir, self.collection)
        if not todo:
            return  # nothing to read: the cluster is not joined at all
        router = FileRouter(
            self.service.content_index(self.collection),
            self.service.remembered_deletions(self.collection),
            run.copies,
        )
        await asyncio.to_thread(self._run_on_cluster, run, todo, router)

    def _run_on_cluster(self, run: IndexRun, todo: Todo, router: FileRouter) -> None:
        summary, stop, report = run.summary, run.stop, run.report
        settings = self._node_settings(run)
        session = RaySession(self.address)
        sharded = self.shard_dir is not None and len(todo) > self.shard_threshold
        shards = ShardLog(self.shard_dir, self.collection) if sharded and self.shard_dir else None
        commit_at = self.shard_rows if shards else self.batch_size
        pending: list[tuple[PreparedFile, np.ndarray]] = []
        seen: set[int] = set()  # positions in `todo` routed already: Ray may deliver a redone task's rows twice
        try:
            jobs = [encode_job(position, entry, state) for position, (entry, state) in enumerate(todo)]
            for batch in session.embed(jobs, settings, self.batch_size):
                if stop.is_set():
                    break  # what is committed stays; the batches on the cluster are dropped
                for row, position in enumerate(batch["position"].tolist()):
                    if position not in seen:
                        seen.add(position)
                        self._route(run, batch, row, router, pending)
                while len(pending) >= commit_at:
                    self._commit_pending(run, pending[:commit_at], shards)
                    pending = pending[commit_at:]
                report(summary)
            if pending and not stop.is_set():
                self._commit_pending(run, pending, shards)
                report(summary)
            if shards:
                shards.close()  # the run ended: every shard committed (or stopped, and planned again by a rerun)
        finally:
            session.close()

    def _route(
        self,
        run: IndexRun,
        batch: dict[str, Any],
        row: int,
        router: FileRouter,
        pending: list[tuple[PreparedFile, np.ndarray]],
    ) -> None:
        """One file back from the cluster: a bad file, no image, new bytes (to commit) or known ones."""
        summary: IndexSummary = run.summary
        outcome = pickle.loads(batch["outcome"][row])
        if outcome is None:
            summary.not_images += 1
        elif isinstance(outcome, tuple):
            summary.failures.append(outcome)
        else:
            action = router.route(outcome, summary)
            if action == "embed":
                pending.append((outcome, batch["vector"][row]))
                self.nodes.add(str(batch["node"][row]), float(batch["embed_s"][row]))
            elif action is not None:
                self._apply_move(run, action)

    def _commit_pending(
        self, run: IndexRun, pending: list[tuple[PreparedFile, np.ndarray]], shards: ShardLog | None
    ) -> None:
        """One batch committed through the service, or (`shards`) one shard written, then loaded from its
        file in one transaction and marked done (the committer's rate counts the load: read and commit)."""
        if shards is None:
            started = time.perf_counter()
            files = [prepared for prepared, _ in pending]
            self._commit(run, files, np.stack([vector for _, vector in pending]).astype(np.float32))
        else:
            path = shards.write(pending)
            started = time.perf_counter()
            images, replaces, vectors = read_shard(path)
            run.before_write()
            key = run.target.vector_key
            results = self.service.writes.load_images(run.target, images, vectors, replace=replaces, vector_key=key)
            self._count_committed(run.summary, replaces, results)
            shards.mark_done(path, len(results))
            self.nodes.shards += 1
        self.nodes.committed += len(pending)
        self.nodes.commit_s += time.perf_counter() - started
