"""What runs on the cluster's nodes during `cnclip index --ray`: the read stage (Ray tasks) and the
embed stage (Ray actors). Both are the local pipeline's own parts (indexer/bulk/pipeline.py), moved:
a task reads, hashes, probes and dates a file exactly as a reader thread does (indexer/bulk/reading.py),
decoding and preprocessing it exactly as the encoder does (retrieval/preprocess.py, the model's
manifest); an actor holds one started encoder of the model (its sessions, planned by that node's
tuning file when it has one) and turns the pixels into vectors. Nothing here touches the catalog:
the driver routes and commits (indexer/bulk/cluster/indexer.py).

Rows cross the cluster as Arrow columns: `job` (the pickled file to read, its position in the run's
plan and what the catalog knew of its path), then `position`, `outcome` (the pickled `PreparedFile`, a `(path, reason)` failure, or None
for a file that is no image) and `pixels` (zeros where there are none), then `vector` and `node`.
Each node needs the project installed and the model directory at the same path as the driver.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import time
from pathlib import Path

import numpy as np

from indexer.bulk.reading import PreparedFile, pixels_and_hash, read_file
from retrieval.config import RuntimeSettings
from retrieval.manifest import ModelManifest
from retrieval.preprocess import ImagePreprocessor

Batch = dict[str, np.ndarray]


@functools.lru_cache(maxsize=4)
def _manifest(model_dir: str) -> ModelManifest:
    """The model's manifest, read once per worker process (its size, mean and std)."""
    return ModelManifest.load(Path(model_dir))


def read_and_preprocess(batch: Batch, *, model_dir: str, max_bytes: int, max_pixels: int) -> Batch:
    """The read stage for one batch of jobs: every file read (bad files become `(path, reason)`
    outcomes, as in a local run), and the images decoded into the model's input."""
    manifest = _manifest(model_dir)
    shape = (3, manifest.image_size, manifest.image_size)
    preprocess = ImagePreprocessor(manifest.image_size, manifest.mean, manifest.std, max_bytes, max_pixels)
    decode = functools.partial(pixels_and_hash, preprocess)
    outcomes: list[bytes] = []
    pixels = np.zeros((len(batch["job"]), *shape), dtype=np.float32)
    has_pixels = np.zeros(len(batch["job"]), dtype=bool)
    positions = np.zeros(len(batch["job"]), dtype=np.int64)
    for row, job in enumerate(batch["job"]):
        positions[row], entry, state = pickle.loads(job)
        # Every file decoded and perceptually hashed (one decode): the driver alone knows which bytes
        # the collection has, and a file it moves instead of embedding merely wastes the work.
        outcome: PreparedFile | tuple[str, str] | None = read_file(entry, state, decode, _always, max_bytes)
        if isinstance(outcome, PreparedFile):
            if outcome.decode_error is not None:  # what the encoder would refuse: a bad file, as in a local run
                outcome = (str(entry.path), outcome.decode_error)
            elif outcome.pixels is not None:
                pixels[row], outcome.pixels = outcome.pixels, None  # the pixels travel in their own column
                has_pixels[row] = True
        outcomes.append(pickle.dumps(outcome))
    return {
        "position": positions,
        "outcome": np.array(outcomes, dtype=object),
        "pixels": pixels,
        "has_pixels": has_pixels,
    }


def _always(_sha256: str) -> bool:
    return True


class EmbedActor:
    """One encoder of the model on the node this actor runs on (Ray Data's actor pool keeps it
    between batches: the sessions load once). Its own event loop drives the encoder's batcher."""

    def __init__(self, settings: RuntimeSettings) -> None:
        import ray  # on the node: the actor runs inside Ray

        from retrieval.encoder import create_encoder

        # The node's address and the start of its Ray id: nodes of one machine share the address.
        self.node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
        self.loop = asyncio.new_event_loop()
        self.encoder = create_encoder(settings)
        self.loop.run_until_complete(self.encoder.start())

    def __call__(self, batch: Batch) -> Batch:
        started = time.perf_counter()
        rows = np.flatnonzero(batch["has_pixels"])
        vectors = np.zeros((len(batch["has_pixels"]), self.encoder.dim), dtype=np.float32)
        if len(rows):
            vectors[rows] = self.loop.run_until_complete(self.encoder.embed_pixels(batch["pixels"][rows]))
        busy = (time.perf_counter() - started) / max(len(rows), 1)  # this batch's seconds, shared by its images
        return {
            "position": batch["position"],
            "outcome": batch["outcome"],
            "vector": vectors,
            "has_vector": batch["has_pixels"],
            "node": np.array([self.node if has else "" for has in batch["has_pixels"]], dtype=object),
            "embed_s": np.where(batch["has_pixels"], busy, 0.0),
        }
