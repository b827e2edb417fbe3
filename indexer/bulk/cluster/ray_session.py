"""The Ray side of `cnclip index --ray`: importing Ray (an extra), joining the cluster, and the Ray
Data plan that reads on the nodes and embeds in one actor per node (indexer/bulk/cluster/node_stages.py).

Every stage asks for a fraction of a CPU: a node with one or two cores otherwise deadlocks, the read
tasks holding every CPU while the actors wait for one (measured on a 2-core machine). The two stages
ask for different fractions on purpose: Ray Data fuses stages of equal resources, and fused, every
file would be read and decoded in the actor's one thread instead of in tasks beside it. An actor asks
for one GPU (or one Ascend `NPU`, the resource name a node advertises with `ray start --resources`)
where the cluster has them, so each accelerator holds one model.
"""

from __future__ import annotations

import logging
import pickle
import socket
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from indexer.bulk.cluster.node_stages import EmbedActor, read_and_preprocess
from indexer.bulk.cluster.watchdog import Stalled, with_deadline
from retrieval.config import RuntimeSettings
from retrieval.errors import EncoderUnavailable, InvalidInput

EXTRA_HINT = "pip install 'cnclip-search[cluster]'"
READ_TASK_CPUS = 0.25  # see the module docstring
ACTOR_CPUS = 0.5
FILES_PER_READ_TASK = 16  # one read task's batch; small enough that every node gets some


class ClusterLost(EncoderUnavailable):
    """The cluster failed the run part-way (a node or an actor lost): exit status 1, the batches
    committed before stay, and a rerun goes on from there."""

    code = "cluster_lost"


def import_ray() -> ModuleType:
    """Ray with Ray Data, or one line naming the extra that installs them."""
    try:
        import ray
        import ray.data  # noqa: F401 - the part this needs; it fails where pyarrow does not fit numpy
    except ImportError as exc:
        raise InvalidInput(f"--ray needs Ray ({EXTRA_HINT}): {exc}") from exc
    return ray


REACH_TIMEOUT_S = 5.0


def check_reachable(address: str) -> None:
    """One line, at once, when nothing answers at a `host:port` (or `ray://host:port`) address:
    `ray.init` itself retries a dead address for minutes without a word. "auto" is Ray's to find."""
    host_port = address.removeprefix("ray://")
    if address == "auto" or ":" not in host_port:
        return  # Ray's own error for a malformed address is immediate
    host, _, port = host_port.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"cannot join the Ray cluster at {address}: the port must be 1-65535")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise InvalidInput(f"cannot join the Ray cluster at {address}: nothing answers there ({exc})") from exc


class RaySession:
    """This process joined to a Ray cluster at `address` ("auto", "host:port", "ray://…"), for one run.
    It leaves the cluster on `close()` when it joined it (a caller already joined stays joined)."""

    def __init__(self, address: str) -> None:
        self.ray = import_ray()
        self._joined = not self.ray.is_initialized()
        if self._joined:
            check_reachable(address)
            try:
                self.ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:  # no cluster there
                raise InvalidInput(f"cannot join the Ray cluster at {address}: {exc}") from exc
        # Its per-dataset lines would break the bar, and its traceback of a failed run is said in one line
        # (`ClusterLost`, below).
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
        context = self.ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the run has its own bar (cli/progress.py)
        context.print_on_execution_start = False

    def close(self) -> None:
        if self._joined:
            self.ray.shutdown()

    def alive_nodes(self) -> int:
        return sum(1 for node in self.ray.nodes() if node.get("Alive"))

    def actor_resources(self) -> dict[str, Any]:
        """What one embedding actor asks for: a GPU or an NPU where the cluster has them."""
        total = self.ray.cluster_resources()
        if total.get("GPU"):
            return {"num_gpus": 1}
        if total.get("NPU"):
            return {"resources": {"NPU": 1}}
        return {}

    def embed(self, jobs: list[bytes], settings: RuntimeSettings, batch_size: int) -> Iterator[dict[str, Any]]:
        """Batches of embedded rows (indexer/bulk/cluster/node_stages.py), as they finish, in any order."""
        data = self.ray.data
        resources = self.actor_resources()
        accelerators = self.ray.cluster_resources().get("GPU") or self.ray.cluster_resources().get("NPU")
        actors = int(accelerators) if accelerators else self.alive_nodes()
        blocks = max(1, -(-len(jobs) // FILES_PER_READ_TASK))
        dataset = data.from_items([{"job": job} for job in jobs], override_num_blocks=blocks)
        limits: dict[str, Any] = {"model_dir": str(settings.model_dir)}
        limits |= {"max_bytes": settings.max_image_bytes, "max_pixels": settings.max_image_pixels}
        dataset = dataset.map_batches(
            read_and_preprocess,
            fn_kwargs=limits,
            batch_size=FILES_PER_READ_TASK,
            batch_format="numpy",
            num_cpus=READ_TASK_CPUS,
        )
        with warnings.catch_warnings():  # max_restarts has no named parameter yet (Ray 2.60)
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            dataset = dataset.map_batches(
                EmbedActor,
                fn_constructor_kwargs={"settings": settings},
                batch_size=batch_size,
                batch_format="numpy",
                # At most two batches queued per actor, so that every actor gets some (not the first one all).
                compute=data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=2),
                num_cpus=ACTOR_CPUS,  # Ray Data spreads its actors over the nodes (its default: SPREAD)
                # A lost node fails the run (what is committed stays; the rerun goes on from there): a
                # restarted actor waiting for room the remaining nodes' stages hold would hang it.
                max_restarts=0,
                max_task_retries=0,
                **resources,
            )
        try:
            yield from with_deadline(dataset.iter_batches(batch_size=batch_size, batch_format="numpy"))
        except (self.ray.exceptions.RayError, Stalled) as exc:  # a node lost, an actor gone, a task failed
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ClusterLost(
                f"the Ray cluster lost the run ({type(exc).__name__}: {first_line}); everything committed is kept: "
                "run the same command again to resume"
            ) from exc


def encode_job(position: int, entry: Any, state: Any) -> bytes:
    """One file for the read stage: its position in the plan, the entry and what the catalog knew of its path."""
    return pickle.dumps((position, entry, state))
