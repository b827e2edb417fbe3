"""An encoder that embeds through a remote Triton / KServe v2 server (`CNCLIP_ENCODER=triton://host:port`).

The remote serves `cnclip_text` (INT64 token ids → `text_features`) and `cnclip_image_bytes` (raw
JPEG/PNG bytes → `image_features`, preprocessing on the server: our own `/v2` endpoint or the
ensemble that `cnclip export-triton` writes), and optionally `cnclip_image` (normalised pixels).
Texts are tokenised here, so only token ids travel, and only those the query cache
(retrieval/query_cache.py) lacks.

The local model directory's `manifest.json` stays the source of truth for the model id, the
dimension and `logit_scale` (the vectors in the catalog are tagged with it); `start()` checks that
the remote models' shapes agree with it and refuses to start otherwise. It also reads each model's
`max_batch_size` from its configuration (a Triton repository exported with `--max-batch 16` takes
at most 16 items per request) and splits larger batches accordingly.

After a successful start, a model that disappears (unloaded, or still loading after a restart of
the server) is a passing outage, not a configuration error: it is retried like a 5xx and then
reported as `EncoderUnavailable` (503).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
import numpy as np
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from retrieval.config import RuntimeSettings
from retrieval.encoder_url import parse_encoder_url
from retrieval.errors import EncoderUnavailable, InvalidImage, InvalidInput, ModelError, Overloaded, PayloadTooLarge
from retrieval.manifest import ModelManifest
from retrieval.query_cache import QueryCache, TokenKey, embed_with_cache
from retrieval.text_lengths import split_by_length
from retrieval.triton_names import IMAGE_BYTES_MODEL, IMAGE_MODEL, TEXT_MODEL, is_text_model, text_model
from retrieval.types import EncoderObserver

log = logging.getLogger("cnclip.remote")

MAX_ITEMS_PER_REQUEST = 64  # larger batches are split and sent concurrently
HEALTH_TIMEOUT_S = 2.0  # `/readyz`'s question to the server: a healthy one answers in milliseconds
# aiohttp offers gzip/deflate by default, and Triton (and our /v2) then compress every response: CPU on
# both ends for float vectors that hardly compress.
_NO_COMPRESSION = {"Accept-Encoding": "identity"}

T = TypeVar("T")


class TritonEncoder:
    """The `Encoder` protocol over tritonclient's asyncio HTTP client (one pooled session)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        manifest: ModelManifest | None = None,
        *,
        url: str | None = None,
        timeout_s: float | None = None,
        retries: int | None = None,
        connections: int | None = None,
        backoff_s: float = 0.05,
        observer: EncoderObserver | None = None,
    ) -> None:
        self.settings = settings
        self.observer = observer
        self.address = parse_encoder_url(url or settings.encoder)
        # API and indexer nodes only need manifest.json, not the graphs, so the files are not verified.
        self.manifest = manifest or ModelManifest.load(settings.model_dir, verify=False)
        self.model_id = self.manifest.model_id
        self.dim = self.manifest.embed_dim
        self.logit_scale = self.manifest.logit_scale
        self.image_size = self.manifest.image_size
        self.context_length = self.manifest.context_length
        self.timeout_s = settings.encoder_timeout_s if timeout_s is None else timeout_s
        self.retries = settings.encoder_retries if retries is None else retries
        self.connections = settings.encoder_connections if connections is None else connections
        self.backoff_s = backoff_s
        self._client: triton_aio.InferenceServerClient | None = None
        # Per remote model: its input shape as served. Our /v2 and a dynamic Triton export take [-1, ...];
        # a static (npu_ge) export takes exactly [B, ...], so requests are padded to B.
        self._inputs: dict[str, list[int]] = {}
        # Per remote model: the most items one request may carry (its config's max_batch_size, capped).
        self._max_items: dict[str, int] = {}
        # The text length buckets the server offers (a `cnclip_text_lN` model each), ascending; the last is
        # the full length (`cnclip_text`). Each text is sent to the shortest that holds it.
        self.text_lengths: list[int] = [self.context_length]
        self.query_cache: QueryCache[TokenKey] = QueryCache(settings.query_cache_size)
        self._ready = False
        self._health_client: triton_aio.InferenceServerClient | None = None  # `check_health`'s own connection

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        """Connect, and check that the remote models exist with the manifest's shapes."""
        # No session-wide timeout: each call gets `timeout_s` of its own (see _with_retries).
        self._client = triton_aio.InferenceServerClient(self.address, conn_limit=self.connections, conn_timeout=None)
        try:
            client = self._client
            live = await self._with_retries("liveness check", lambda: client.is_server_live())
            if not live:
                raise EncoderUnavailable(f"Triton server at {self.address} is not live")
            ctx, size = self.context_length, self.image_size
            await self._check_model(TEXT_MODEL, "INT64", [[ctx]])
            for length in self._manifest_text_lengths():
                await self._check_model(text_model(length), "INT64", [[length]], required=False)
            self.text_lengths = [n for n in self._manifest_text_lengths() if text_model(n) in self._inputs] + [ctx]
            await self._check_model(IMAGE_BYTES_MODEL, "BYTES", [[], [1]])
            await self._check_model(IMAGE_MODEL, "FP32", [[3, size, size]], required=False)
        except BaseException:
            await self.close()
            raise
        self._ready = True
        log.info(
            "remote encoder: Triton at %s serves %s (dim %d); text lengths %s",
            self.address,
            self.model_id,
            self.dim,
            self.text_lengths,
        )

    async def check_health(self) -> None:
        """Whether the server can embed now (for `/readyz`): its `/v2/health/ready` answers 200 within
        HEALTH_TIMEOUT_S (one request, no retries); else `EncoderUnavailable` saying why. (Triton is
        ready once every model of its repository is; `cnclip worker` once its encoder is warm.) Its own
        connection: inference holding every pooled one under load must not make a busy server "down"."""
        self._require_client()
        if self._health_client is None:
            self._health_client = triton_aio.InferenceServerClient(self.address, conn_limit=1, conn_timeout=None)
        client = self._health_client
        limit = min(HEALTH_TIMEOUT_S, self.timeout_s)
        try:
            async with asyncio.timeout(limit):
                ready = await client.is_server_ready(headers=_NO_COMPRESSION)
        except TimeoutError:
            raise EncoderUnavailable(
                f"Triton server at {self.address} did not answer its readiness check within {limit:g} s"
            ) from None
        except (aiohttp.ClientError, OSError, InferenceServerException) as exc:
            raise EncoderUnavailable(
                f"cannot reach Triton server at {self.address} ({type(exc).__name__}: {exc})"
            ) from None
        if not ready:
            raise EncoderUnavailable(f"Triton server at {self.address} is not ready (/v2/health/ready)")

    def _manifest_text_lengths(self) -> list[int]:
        """The shorter text lengths the model has at any precision: what the server may offer."""
        spec = self.manifest.towers["text"]
        return sorted({n for precision in spec.precisions() for n in spec.short_lengths(precision)})

    async def close(self) -> None:
        self._ready = False
        if self._health_client is not None:
            health, self._health_client = self._health_client, None
            await health.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenise here, embed remotely."""
        if isinstance(texts, str):
            raise InvalidInput("embed_texts takes a list of strings, not one string")
        from retrieval.tokenizer import tokenize  # imported late: loading the vocabulary takes a moment

        return await self.embed_token_ids(tokenize(list(texts), context_length=self.context_length))

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        """Through the query cache; each row it lacks goes to the shortest text model the server offers
        that holds its tokens."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        return await embed_with_cache(self.query_cache, self.model_id, "text", ids, self._embed_by_length)

    async def _embed_by_length(self, ids: np.ndarray) -> np.ndarray:
        if len(ids) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        groups = split_by_length(ids, self.text_lengths)
        models = [text_model(None if part.shape[1] == self.context_length else part.shape[1]) for _, part in groups]
        vectors = await asyncio.gather(
            *(self._embed_chunks(model, "text", "INT64", part) for model, (_, part) in zip(models, groups, strict=True))
        )
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for (rows, _), group_vectors in zip(groups, vectors, strict=True):
            out[rows] = group_vectors
        return out

    async def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        if IMAGE_MODEL not in self._inputs:
            raise ModelError(f"Triton server at {self.address} has no model '{IMAGE_MODEL}' for raw pixels")
        pixels = np.ascontiguousarray(pixels, dtype=np.float32)
        return await self._embed_chunks(IMAGE_MODEL, "image", "FP32", pixels)

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        """Send the encoded files; the server decodes and preprocesses them (the seed's ensemble)."""
        limit = self.settings.max_image_bytes
        for i, data in enumerate(images):
            if len(data) > limit:
                raise PayloadTooLarge(f"image {i} has {len(data)} bytes; the limit is {limit}")
        array = np.array([bytes(b) for b in images], dtype=np.object_)
        return await self._embed_chunks(IMAGE_BYTES_MODEL, "image_bytes", "BYTES", array)

    async def _embed_chunks(self, model: str, input_name: str, datatype: str, batch: np.ndarray) -> np.ndarray:
        """Split into requests the remote takes (padding to a static model's batch), sent concurrently."""
        if len(batch) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        shape = self._inputs[model]
        fixed = shape[0] if shape[0] > 0 else None
        size = fixed or self._max_items.get(model, MAX_ITEMS_PER_REQUEST)
        requests = []
        for start in range(0, len(batch), size):
            chunk = batch[start : start + size]
            rows = len(chunk)
            if fixed is not None and rows < fixed:
                # Repeat the last item rather than invent one: a padding row must be valid input (an image).
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], fixed - rows, axis=0)])
            if len(shape) == 2 and datatype == "BYTES":
                chunk = chunk.reshape(-1, 1)  # a Triton ensemble with dims [1] per item
            requests.append(self._infer(model, input_name, datatype, chunk, rows))
        return np.concatenate(await asyncio.gather(*requests), axis=0)

    async def _infer(self, model: str, input_name: str, datatype: str, batch: np.ndarray, rows: int) -> np.ndarray:
        """One request; returns the first `rows` vectors (the rest is padding)."""
        client = self._require_client()
        tensor = triton_http.InferInput(input_name, list(batch.shape), datatype)
        tensor.set_data_from_numpy(batch, binary_data=True)
        output_name = "text_features" if is_text_model(model) else "image_features"
        wanted = [triton_http.InferRequestedOutput(output_name, binary_data=True)]

        async def call() -> np.ndarray:
            result = await client.infer(model, [tensor], outputs=wanted, headers=_NO_COMPRESSION)
            features = result.as_numpy(output_name)
            if features is None:
                raise ModelError(f"Triton model '{model}' at {self.address} returned no '{output_name}'")
            return features

        rejected = InvalidImage if datatype == "BYTES" else InvalidInput
        started = time.perf_counter()
        features = await self._with_retries(f"{model} inference", call, rejected, model_may_vanish=True)
        n = batch.shape[0]
        if self.observer is not None:
            # The remote batches on its own; here a "batch" is one request and its round trip is "inference".
            tower = "text" if is_text_model(model) else "image"
            timings = {"queue": 0.0, "preprocess": 0.0, "inference": time.perf_counter() - started, "post": 0.0}
            self.observer.batch_done(tower, n, rows, timings)
        if features.shape != (n, self.dim) or features.dtype != np.float32:
            raise ModelError(
                f"Triton model '{model}' at {self.address} returned {features.dtype} {list(features.shape)}, "
                f"expected float32 {[n, self.dim]} (manifest of {self.manifest.name})"
            )
        return features[:rows]

    async def _check_model(self, name: str, datatype: str, item_dims: list[list[int]], required: bool = True) -> None:
        """Check a model's metadata against the manifest and remember its input shape.

        Accepted: input `datatype` [batch, *item_dims] and output FP32 [batch, dim], where batch is -1
        (dynamic) or a fixed size B (a static graph); `required=False` tolerates a missing model.
        """
        client = self._require_client()
        try:
            meta = await self._with_retries(f"metadata of {name}", lambda: client.get_model_metadata(name))
        except ModelError:
            if required:
                raise
            return
        inputs, outputs = meta.get("inputs") or [], meta.get("outputs") or []
        if len(inputs) != 1 or len(outputs) < 1:
            raise ModelError(
                f"Triton model '{name}' at {self.address} has {len(inputs)} inputs and {len(outputs)} outputs; "
                "expected one input and one output"
            )
        got_in, got_out = inputs[0], outputs[0]
        in_shape = [int(s) for s in got_in.get("shape", [])]
        out_shape = [int(s) for s in got_out.get("shape", [])]
        batch = in_shape[0] if in_shape else 0
        wanted = " or ".join(str(["B", *dims]) for dims in item_dims).replace("'B'", "B")
        if got_in.get("datatype") != datatype or batch == 0 or batch < -1 or in_shape[1:] not in item_dims:
            raise ModelError(
                f"Triton model '{name}' at {self.address} takes {got_in.get('datatype')} {in_shape}, but the "
                f"manifest of {self.manifest.name} needs {datatype} {wanted} (B = -1 or a fixed batch)"
            )
        output_name = "text_features" if is_text_model(name) else "image_features"
        if got_out.get("name") != output_name:
            raise ModelError(
                f"Triton model '{name}' at {self.address} outputs '{got_out.get('name')}', expected '{output_name}' "
                "(L2-normalised features; see `cnclip export-triton`)"
            )
        if got_out.get("datatype") != "FP32" or out_shape != [batch, self.dim]:
            raise ModelError(
                f"Triton model '{name}' at {self.address} outputs {got_out.get('datatype')} {out_shape}, but the "
                f"manifest of {self.manifest.name} has embed_dim {self.dim} (FP32 {[batch, self.dim]})"
            )
        self._inputs[name] = in_shape
        if batch == -1:
            self._max_items[name] = await self._max_batch_size(name)

    async def _max_batch_size(self, name: str) -> int:
        """Items per request for a batching model: its config's `max_batch_size`, at most
        MAX_ITEMS_PER_REQUEST; MAX_ITEMS_PER_REQUEST when the server has no configuration route."""
        client = self._require_client()
        try:
            config = await self._with_retries(f"configuration of {name}", lambda: client.get_model_config(name))
        except (ModelError, InvalidInput, TypeError):
            # A KServe v2 server without Triton's model_configuration extension. (tritonclient raises
            # TypeError when such a server's 404 body is not v2's {"error": "..."}, as earlier cnclip servers did.)
            return MAX_ITEMS_PER_REQUEST
        max_batch = config.get("max_batch_size") if isinstance(config, dict) else None
        if isinstance(max_batch, int) and max_batch > 0:
            return min(max_batch, MAX_ITEMS_PER_REQUEST)
        return MAX_ITEMS_PER_REQUEST

    async def _with_retries(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        rejected: type[InvalidInput] = InvalidInput,
        model_may_vanish: bool = False,
    ) -> T:
        """Retry connection errors and 5xx answers with exponential backoff; map the rest to project errors.

        `rejected` is the error for a 400 answer: the request's content is at fault (e.g. a corrupt image).
        `model_may_vanish`: the model was there at start-up, so "unknown model" / "not ready" means it is
        being unloaded or reloaded: retried, then EncoderUnavailable, never a configuration error.
        """
        attempt = 0
        started = time.perf_counter()
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await call()
            except TimeoutError as exc:
                # A slow server is not helped by sending it the same work again.
                raise EncoderUnavailable(
                    f"Triton server at {self.address} did not answer the {what} within {self.timeout_s:g} s"
                ) from exc
            except aiohttp.ClientConnectionError as exc:
                cause = f"cannot reach Triton server at {self.address} ({type(exc).__name__}: {exc})"
            except InferenceServerException as exc:
                status = int(exc.status()) if (exc.status() or "").isdigit() else 0
                message = exc.message() or str(exc)
                if model_may_vanish and _model_gone(status, message):
                    cause = f"Triton server at {self.address} has no ready model for the {what} ({status}: {message})"
                elif status < 500:
                    raise _client_error(status, message, what, self.address, rejected) from None
                else:
                    cause = f"Triton server at {self.address} failed the {what} with {status}: {message}"

            if attempt >= self.retries:
                elapsed = time.perf_counter() - started
                raise EncoderUnavailable(f"{cause}; gave up after {attempt + 1} attempts in {elapsed:.1f} s")
            delay = min(self.backoff_s * 2**attempt, 2.0) * (0.5 + random.random() / 2)
            log.warning("%s; retrying in %.2f s", cause, delay)
            attempt += 1
            await asyncio.sleep(delay)

    def _require_client(self) -> Any:
        if self._client is None:
            raise EncoderUnavailable("remote encoder is not started (call start() first)")
        return self._client


def _model_gone(status: int, message: str) -> bool:
    """Triton's answers for a model that is not loaded (404, or 400 on older servers) or not ready yet."""
    lowered = message.lower()
    return status == 404 or "unknown model" in lowered or "not ready" in lowered or "no available versions" in lowered


def _client_error(status: int, message: str, what: str, address: str, rejected: type[InvalidInput]) -> Exception:
    """Map a 4xx answer to the project's error: the request is at fault, retrying cannot help."""
    if status == 429:
        return Overloaded(f"Triton server at {address} is overloaded: {message}")
    if status == 413:
        return PayloadTooLarge(message)
    lowered = message.lower()
    # Triton answers 400 (KServe: 404) with "unknown model" when the model is not in its repository.
    if status == 404 or "unknown model" in lowered:
        return ModelError(f"Triton server at {address} has no model for the {what}: {message}")
    return rejected(f"Triton server at {address} rejected the {what}: {message}")
