"""The local encoder: sessions per tower, bucket and stream behind a dynamic batcher.

Each tower runs on the backend, device and precision its plan names (retrieval/tower_plan.py: a
matching `cnclip tune` file, else ONNX Runtime's defaults); the sessions come from that backend's
record (retrieval/backends/).

pre (tokenize / decode + normalise, off the event loop) → batcher (bounded queue, buckets,
streams) → core (session.run of a fixed-shape graph) → post (drop padding, L2-normalise). Token ids
pass the query cache (retrieval/query_cache.py) first: only rows it lacks reach the batcher.
`create_encoder(settings)` is the one factory the API, the CLI and the indexer call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from PIL import Image

from retrieval.backends import DeviceChoice, SessionConfig, cpu_thread_plan
from retrieval.batcher import DynamicBatcher
from retrieval.config import RuntimeSettings
from retrieval.errors import EncoderUnavailable, InvalidImage, InvalidInput, ModelError
from retrieval.fair_pool import FairPool, ItemFailed
from retrieval.machine_limits import CoreGate
from retrieval.manifest import ModelManifest
from retrieval.preprocess import ImagePreprocessor
from retrieval.query_cache import QueryCache, TokenKey, embed_with_cache
from retrieval.sessions import BucketedSession, SessionFactory, Stream, StreamPool
from retrieval.shared_weights import SharedWeights
from retrieval.text_lengths import split_by_length
from retrieval.tokenizer import default_tokenizer
from retrieval.tower_plan import TowerPlan, fit_budget, plan_towers
from retrieval.tuning import read_tuning, tuning_path
from retrieval.types import TOWERS, Encoder, EncoderObserver

log = logging.getLogger(__name__)

_TOKENIZE_INLINE = 64  # texts tokenized on the event loop; more go to a thread (a few µs each)


class LocalEncoder:
    """Embeds texts and images with the model directory's ONNX graphs on this machine.

    `await start()` plans each tower (backend, device, precision, prepacked shapes, streams), opens
    one session per tower, shape and stream and runs every one once; only then is `ready` True.
    `session_factory` replaces every backend's sessions (tests inject fakes through it). `core_gate`:
    the compute-thread permits its streams and decode workers hold (retrieval/machine_limits.py);
    encoders of several models in one process pass the same one (default: its own, of every core).
    """

    def __init__(
        self,
        settings: RuntimeSettings,
        manifest: ModelManifest | None = None,
        observer: EncoderObserver | None = None,
        session_factory: SessionFactory | None = None,
        core_gate: CoreGate | None = None,
    ) -> None:
        self.settings = settings
        self.manifest = manifest if manifest is not None else ModelManifest.load(settings.model_dir)
        self.model_id = self.manifest.model_id
        self.dim = self.manifest.embed_dim
        self.logit_scale = self.manifest.logit_scale
        self.image_size = self.manifest.image_size
        self.context_length = self.manifest.context_length
        self.observer = observer
        self.provider: DeviceChoice | None = None
        self.plans: dict[str, TowerPlan] = {}
        self.precision: dict[str, str] = {}
        self.buckets: dict[str, list[int]] = {}
        self.text_lengths: list[int] = [self.context_length]  # length buckets, ascending; the last is the full one
        self.tight_text = False  # every text stream runs any length: a group runs at its longest row
        self._session_factory = session_factory
        self._batchers: dict[str, DynamicBatcher] = {}
        self._pools: dict[str, StreamPool] = {}
        self._preprocess_pool: FairPool | None = None
        self._tokenizer = default_tokenizer()
        self._vocab_size = len(self._tokenizer.vocab)
        self.query_cache: QueryCache[TokenKey] = QueryCache(settings.query_cache_size)
        # Every compute thread (streams of both towers, decode workers) holds its share while it works.
        self.core_gate = core_gate if core_gate is not None else CoreGate()
        self._ready = False

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    def _plan(self) -> None:
        """Each tower's plan: the tuning file when it fits this model and machine, else the defaults."""
        path = tuning_path(self.settings.model_dir, self.settings.tuning_file)
        outcome = read_tuning(path, self.model_id, self.settings.model_dir)
        log.log(outcome.level, "%s", outcome.line)
        plans = plan_towers(self.settings, self.manifest, outcome.tuning)
        self.text_lengths = self._plan_text_lengths(plans["text"].graph)
        self.plans = fit_budget(plans, self.manifest, self.settings.memory_budget_mb, self._shape_count, outcome.tuning)
        for tower, plan in self.plans.items():
            self.precision[tower], self.buckets[tower] = plan.precision, plan.buckets
        self.provider = self.plans["text"].device

    def _shape_count(self, plan: TowerPlan) -> int:
        return len(plan.buckets) * (len(self.text_lengths) if plan.tower == "text" else 1)

    def _plan_text_lengths(self, precision: str) -> list[int]:
        have = self.manifest.text_lengths(precision)
        wanted = self.settings.text_lengths
        if not wanted:
            return have
        missing = [n for n in wanted if n not in have]
        if missing:
            raise ModelError(
                f"CNCLIP_TEXT_LENGTHS asks for {missing}, but the model's text/{precision} graphs have lengths {have}"
            )
        # The full length always stays: it is the only graph that holds the longest texts.
        return sorted({*wanted, self.context_length})

    def _open_streams(self) -> dict[str, list[Stream]]:
        """Open and warm every session (blocking: called in a thread)."""
        streams: dict[str, list[Stream]] = {tower: [] for tower in TOWERS}
        try:
            for tower in TOWERS:
                self._open_tower(streams[tower], self.plans[tower])
        except BaseException:
            for opened in streams.values():  # do not leak the threads of what did open
                for stream in opened:
                    stream.close()
            raise
        return streams

    def _open_tower(self, streams: list[Stream], plan: TowerPlan) -> None:
        s = self.settings
        on_cores = plan.backend.uses_cpu_cores(plan.device.name)
        cores_plan = cpu_thread_plan(plan.streams, plan.threads_per_stream) if on_cores else [[]] * plan.streams
        # One per tower, handed to every bucket and stream of the tower that does not prepack its own.
        weights = SharedWeights(f"{plan.tower}/{plan.graph}") if plan.share else None
        factory = self._session_factory or plan.backend.open_session
        for index, cores in enumerate(cores_plan):
            config = SessionConfig(
                provider=plan.device.name,
                precision=plan.graph,
                device_id=s.device_id,
                cores=cores,
                pin_threads=s.pin_threads,
                # The gate hands the cores to the other tower and the decode workers between runs: a
                # pool still spinning after its run would hold a core one of them was just given.
                spin=False,
                weights=weights,
                backend=plan.backend.name,
                run_precision=plan.precision,
                dynamic_shapes=plan.dynamic,
            )
            session = BucketedSession.open(
                self.manifest,
                plan.tower,
                plan.graph,
                plan.buckets,
                config,
                factory,
                lengths=self.text_lengths if plan.tower == "text" else (),
                prepack=plan.prepack,  # beside the one session: tuned batch-1 shapes (sessions.py)
            )
            stream = Stream(
                index,
                session,
                cores,
                pin=s.pin_threads and on_cores,
                gate=self.core_gate,
                threads=len(cores),
                urgent=plan.tower == "text",  # a query's batch: short, and someone is waiting for it
            )
            # Warm up in the stream's own (pinned) thread, as it will run.
            streams.append(stream)
            stream.executor.submit(stream.warm_up, self.image_size, self.context_length).result()
        reported = streams[0].session.engine_precisions() if streams else []
        log.info(
            "%s tower: %s (%s), %s, graphs %s, the engine reports %s; weights: %s; %d stream(s) [%s]",
            plan.tower,
            plan.placement(),
            plan.device.reason,
            plan.precision,
            plan.graph,
            "/".join(reported) or "nothing (injected sessions)",
            plan.weights_words(),
            plan.streams,
            plan.source,
        )
        if weights is not None and (weights.sessions or not weights.usable):  # not when one session took every shape
            log.info("%s", weights.summary())

    async def start(self) -> None:
        """Choose provider and precision, open and warm all sessions, start the batchers."""
        if self._ready:
            return
        started = time.perf_counter()
        self._plan()
        streams = await asyncio.to_thread(self._open_streams)
        for tower in TOWERS:
            self._pools[tower] = StreamPool(streams[tower])
            batcher = DynamicBatcher(
                tower,
                self._pools[tower],
                self.buckets[tower],
                max_delay_s=self.settings.max_queue_delay_ms / 1000.0,
                max_queue_size=self.settings.max_queue_size,
                merge_requests=self.settings.dynamic_batching,
                observer=self.observer,
                bucket_seconds=_slowest_per_bucket(streams[tower]),
                any_batch=min((stream.session.any_batch for stream in streams[tower]), default=0),
            )
            batcher.start()
            self._batchers[tower] = batcher
            per_row = ", ".join(f"b{b} {t / b * 1000:.2f}" for b, t in sorted(batcher.bucket_seconds.items()))
            how = (
                f"any size up to {batcher.any_batch} runs unpadded"
                if batcher.any_batch
                else "the batcher pads only where it pays"
            )
            log.info("%s batches, ms per row at warm-up (%s): %s", tower, how, per_row)
        self.tight_text = min((st.session.any_length for st in streams["text"]), default=0) >= self.text_lengths[-1]
        workers = max(1, sum(len(p) for p in cpu_thread_plan(self.settings.streams, self.settings.threads_per_stream)))
        placements = {plan.placement() + f" ({plan.device.reason})" for plan in self.plans.values()}
        # Shared by requests in turns (retrieval/fair_pool.py): one request of many images cannot hold them all.
        self._preprocess_pool = FairPool(min(workers, self.core_gate.cores), "preprocess", gate=self.core_gate)
        self._ready = True
        log.info(
            "encoder %s ready in %.1fs: provider %s; precision text=%s image=%s; buckets %s; "
            "text lengths %s%s (%d text graphs warmed per stream); %d stream(s)",
            self.model_id,
            time.perf_counter() - started,
            " / ".join(sorted(placements)),
            self.precision["text"],
            self.precision["image"],
            self.buckets["text"],
            self.text_lengths,
            ", any length between them unpadded" if self.tight_text else "",
            len(self.buckets["text"]) * len(self.text_lengths),
            max(plan.streams for plan in self.plans.values()),
        )

    async def close(self) -> None:
        """Fail what is queued, finish running batches, release sessions and threads."""
        self._ready = False
        for batcher in self._batchers.values():
            await batcher.close()
        for pool in self._pools.values():
            await asyncio.to_thread(pool.close)
        if self._preprocess_pool is not None:
            self._preprocess_pool.close()
        self._batchers, self._pools, self._preprocess_pool = {}, {}, None

    def compute_threads(self) -> dict[str, int]:
        """The threads that may compute at once, as started: `cores` (the gate's permits: at most the
        cores this process may run on), the `widest_stream`'s threads, the `decode_workers`, and
        `ungated`: streams and pools that compute without holding the gate (0, or the bound is void)."""
        streams = [stream for pool in self._pools.values() for stream in pool.streams]
        decode = self._preprocess_pool
        return {
            "cores": self.core_gate.cores,
            "widest_stream": max((stream.threads for stream in streams), default=0),
            "decode_workers": decode.workers if decode else 0,
            "ungated": sum(stream.gate is not self.core_gate for stream in streams)
            + int(decode is not None and decode.gate is not self.core_gate),
        }

    def queue_depth(self, tower: str) -> int:
        """Rows of `tower` waiting for a batch."""
        batcher = self._batchers.get(tower)
        return batcher.queue_depth if batcher else 0

    # --- embedding ---------------------------------------------------------------------------------
    def _batcher(self, tower: str) -> DynamicBatcher:
        batcher = self._batchers.get(tower)
        if batcher is None or not self._ready:
            raise EncoderUnavailable("the encoder is not started (await encoder.start())")
        return batcher

    async def _submit(self, tower: str, inputs: np.ndarray, preprocess_s: float) -> np.ndarray:
        """Submit rows; a request larger than the queue goes in queue-sized chunks, one after another."""
        batcher = self._batcher(tower)
        limit = max(1, batcher.max_queue_size // 2)
        if len(inputs) <= limit:
            return await batcher.submit(inputs, preprocess_s)
        chunks = [await batcher.submit(inputs[i : i + limit], preprocess_s) for i in range(0, len(inputs), limit)]
        return np.concatenate(chunks)

    async def _submit_text(self, ids: np.ndarray, preprocess_s: float) -> np.ndarray:
        """Token ids (n, context_length) → vectors: through the query cache, and each row the cache
        lacks run in the shortest length bucket that holds it."""
        return await embed_with_cache(
            self.query_cache, self.model_id, "text", ids, partial(self._submit_by_length, preprocess_s=preprocess_s)
        )

    async def _submit_by_length(self, ids: np.ndarray, preprocess_s: float) -> np.ndarray:
        groups = split_by_length(ids, self.text_lengths, tight=self.tight_text)
        if len(groups) == 1:
            return await self._submit("text", groups[0][1], preprocess_s)
        vectors = await asyncio.gather(*(self._submit("text", group, preprocess_s) for _, group in groups))
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for (rows, _), group_vectors in zip(groups, vectors, strict=True):
            out[rows] = group_vectors
        return out

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised float32 (n, dim) for `texts` (cn_clip tokenization, 52 tokens at most)."""
        if isinstance(texts, str):
            raise InvalidInput("embed_texts takes a list of strings, not one string")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self._batcher("text").check_capacity(min(len(texts), self._batcher("text").max_queue_size))
        start = time.perf_counter()
        tokenize = partial(self._tokenizer.tokenize, list(texts), self.context_length)
        ids = tokenize() if len(texts) <= _TOKENIZE_INLINE else await asyncio.to_thread(tokenize)
        return await self._submit_text(ids, time.perf_counter() - start)

    def image_preprocessor(self) -> ImagePreprocessor:
        """Image bytes → this model's pixels (3, R, R), with this encoder's limits: what `embed_images`
        runs on each image before `embed_pixels`. The bulk indexer decodes with it in its own threads
        (indexer/bulk/embedding.py), so the vectors are the same either way."""
        return ImagePreprocessor(
            self.image_size,
            self.manifest.mean,
            self.manifest.std,
            self.settings.max_image_bytes,
            self.settings.max_image_pixels,
        )

    async def embed_images(
        self, images: Sequence[bytes], on_decoded: Callable[[int, Image.Image], None] | None = None
    ) -> np.ndarray:
        """L2-normalised float32 (n, dim) for raw image bytes; `InvalidImage` names the bad one.
        `on_decoded(i, image)` sees each decoded image in its preprocessing thread (an upload's
        perceptual hash comes from the decode its pixels come from: indexer/service/write_cases.py)."""
        if len(images) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self._batcher("image").check_capacity(min(len(images), self._batcher("image").max_queue_size))
        assert self._preprocess_pool is not None
        start = time.perf_counter()
        preprocess = self.image_preprocessor().observed(on_decoded)
        try:
            results = await self._preprocess_pool.map(preprocess, [*enumerate(images)])
        except ItemFailed as failed:
            error = failed.error
            if isinstance(error, InvalidImage) and len(images) > 1:
                raise type(error)(f"image {failed.index}: {error.message}") from error
            raise error from None
        pixels = np.stack(results)
        return await self._submit("image", pixels, time.perf_counter() - start)

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        """Vectors for already-tokenized rows, int64 (n, context_length), through the same batcher."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != self.context_length or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidInput(f"token ids must be integers of shape (n, {self.context_length}), got {ids.shape}")
        if len(ids) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if ids.min() < 0 or ids.max() >= self._vocab_size:
            raise InvalidInput(f"token ids must lie in [0, {self._vocab_size})")
        return await self._submit_text(np.ascontiguousarray(ids, dtype=np.int64), 0.0)

    async def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Vectors for preprocessed images, float32 (n, 3, R, R), through the same batcher."""
        pixels = np.asarray(pixels)
        expected = (3, self.image_size, self.image_size)
        if pixels.ndim != 4 or pixels.shape[1:] != expected:
            raise InvalidInput(f"pixels must have shape (n, {', '.join(map(str, expected))}), got {pixels.shape}")
        if len(pixels) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        pixels = np.ascontiguousarray(pixels, dtype=np.float32)
        if not np.isfinite(pixels).all():
            raise InvalidInput("pixels must be finite numbers")
        return await self._submit("image", pixels, 0.0)


def _slowest_per_bucket(streams: Sequence[Stream]) -> dict[int, float]:
    """Each bucket's warm-up run time over a tower's streams (the slowest: the one batches may meet)."""
    seconds: dict[int, float] = {}
    for stream in streams:
        for bucket, elapsed in stream.bucket_seconds.items():
            seconds[bucket] = max(elapsed, seconds.get(bucket, 0.0))
    return seconds


def create_encoder(
    settings: RuntimeSettings, observer: EncoderObserver | None = None, core_gate: CoreGate | None = None
) -> Encoder:
    """The encoder the settings ask for: local ONNX Runtime, or a remote Triton server
    (`CNCLIP_ENCODER=triton://host:port`). Call `await start()`. A local one computes within
    `core_gate` (one per process: pass the same to every model's encoder)."""
    if settings.encoder != "local":
        from retrieval.remote import TritonEncoder  # imports tritonclient/aiohttp only when asked for

        return TritonEncoder(settings, observer=observer)
    return LocalEncoder(settings, observer=observer, core_gate=core_gate)
