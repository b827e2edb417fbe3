"""A Ray cluster of several nodes on this machine (`ray.cluster_utils.Cluster`) for the `--ray` tests and
benchmark, and what they read back: each committed file's vector, by path, straight from SQL.

Every node gets one CPU: the indexer's stages ask for fractions of one (indexer/bulk/cluster/ray_session.py).
Only the processes this cluster started are stopped (`Cluster.shutdown`), never `ray stop`, which
would kill every Ray process of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sqlalchemy import create_engine, text

NODE_CPUS = 1


@contextmanager
def local_cluster(nodes: int = 2) -> Iterator[Any]:
    """A head and `nodes - 1` more nodes, all on this machine; yields the `Cluster` (`.address`)."""
    from ray.cluster_utils import Cluster

    # Ray kills workers when the machine's memory passes 95%, whoever uses it: on a machine shared
    # with other tests that made runs fail at random. The nodes inherit this from the environment.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": NODE_CPUS})
    try:
        for _ in range(nodes - 1):
            _add_node(cluster)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def top_up(cluster: Any, nodes: int = 2) -> None:
    """Add nodes until `cluster` has `nodes` alive again (a test removed one)."""
    while len(cluster.list_all_nodes()) < nodes:
        _add_node(cluster)
    cluster.wait_for_nodes()


def _add_node(cluster: Any) -> None:
    """One node more. Ray gives a node 30 s to register, which a machine busy with other tests can
    miss (seen at a module's first cluster, late in a full run): one more try then."""
    try:
        cluster.add_node(num_cpus=NODE_CPUS)
    except Exception:  # noqa: BLE001 - Ray raises a bare Exception for the timeout
        cluster.add_node(num_cpus=NODE_CPUS)


def vectors_by_path(database_url: str, collection: str) -> dict[str, np.ndarray]:
    """Every live item of `collection` with a path: its stored (SQL) vector. Raises on two rows at one path."""
    engine = create_engine(database_url)
    query = text(
        "SELECT i.path, v.vector FROM items i JOIN vectors v ON v.item_id = i.id "
        "JOIN collections c ON c.id = i.collection_id WHERE c.name = :name"
    )
    try:
        with engine.connect() as connection:
            rows = list(connection.execute(query, {"name": collection}))
    finally:
        engine.dispose()
    found: dict[str, np.ndarray] = {}
    for path, vector in rows:
        assert path not in found, f"{path} committed twice"
        found[path] = np.frombuffer(vector, dtype="<f4")
    return found


def smallest_cosine(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> float:
    """The smallest cosine between the two runs' vectors of one path (both hold the same paths)."""
    assert set(left) == set(right)
    return min(float(np.dot(left[p], right[p]) / (np.linalg.norm(left[p]) * np.linalg.norm(right[p]))) for p in left)
