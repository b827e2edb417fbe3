"""A server that meets a swap to a model it does not hold loads that model, without a restart.

`cnclip migrate --model DIR` beside a running `cnclip serve` swaps a collection to a model the server
was not started with. Before, its searches answered 422 until a restart. Now the collection service
(indexer/service/migration_cases.py `answering`) asks this loader for the model: the loader reads the
directory the migration recorded for that model id (indexer/storage/sql/model_sources.py), checks it exactly as
`CNCLIP_MODEL_DIRS` is checked at start (retrieval/model_check.py: every file, its sha256, the plan),
and loads and warms it in the background. Meanwhile the collection is answered with its previous
generation (the model this process holds); once the encoder is warm it joins the service's encoders
and the next search moves to the new generation. Searches never fail for the move.

The recorded directory is a hint, never trusted: a directory whose files are no longer the model of
that id (changed, replaced, removed: another fingerprint) is refused with one log line, and the
previous generation goes on answering; the loader tries again after `RETRY_S`. Only when there is
no previous generation either does the collection answer 503.

The model is always loaded into this process (a local encoder), also where the settings' encoder is
a remote worker (`CNCLIP_ENCODER=triton://…`): a worker serves the one model it was started with and
knows no collections, so the API process that owns the catalog is the one that meets the swap
(docs/scaling-out.md says how to move a worker fleet to the new model).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from retrieval.config import RuntimeSettings
from retrieval.encoder import create_encoder
from retrieval.errors import CnclipError, ModelError
from retrieval.manifest import same_model
from retrieval.model_check import check_local_model
from retrieval.types import Encoder, EncoderObserver

log = logging.getLogger(__name__)

RETRY_S = 60.0  # a model that failed to load is tried again after this
LoadState = Literal["loading", "failed"]


@dataclass
class _Attempt:
    state: LoadState
    since: float  # monotonic
    reason: str = ""


class ModelLoader:
    """Loads models by id from their recorded directories, one attempt at a time per model.
    Thread-safe: `request` is called from the worker threads searches resolve in."""

    def __init__(
        self,
        settings: RuntimeSettings,
        source: Callable[[str], str | None],
        on_ready: Callable[[Encoder], None],
        observer: EncoderObserver | None = None,
    ) -> None:
        self.settings = settings
        self.source = source  # model id -> the directory a migration recorded (SQL), or None
        self.on_ready = on_ready  # called on the event loop with a warm encoder of the model
        self.observer = observer
        self.loaded: list[Encoder] = []  # closed with the runtime
        self._attempts: dict[str, _Attempt] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[concurrent.futures.Future[None]] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the loads run on (the runtime's, once open)."""
        self._loop = loop

    def request(self, model: str, dim: int) -> LoadState | None:
        """Make sure `model` (`dim`-d) is being loaded: "loading" (now or already), "failed" (the last
        attempt failed less than `RETRY_S` ago), None (no directory was recorded for it: nothing to load)."""
        with self._lock:
            attempt = self._attempts.get(model)
            if attempt is not None and (attempt.state == "loading" or time.monotonic() - attempt.since < RETRY_S):
                return attempt.state
        directory = self.source(model)
        if directory is None or self._loop is None:
            return None
        with self._lock:
            attempt = self._attempts.get(model)
            if attempt is not None and attempt.state == "loading":
                return "loading"
            self._attempts[model] = _Attempt("loading", time.monotonic())
        future = asyncio.run_coroutine_threadsafe(self._load(model, dim, Path(directory)), self._loop)
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)
        return "loading"

    async def _load(self, model: str, dim: int, directory: Path) -> None:
        started = time.perf_counter()
        local = self.settings.model_copy(update={"model_dir": directory, "encoder": "local"})
        encoder: Encoder | None = None
        try:
            # The same check as CNCLIP_MODEL_DIRS at start: every file, its sha256, the towers' plan.
            manifest = await asyncio.to_thread(check_local_model, local)
            _same(model, dim, manifest.model_id, manifest.embed_dim, directory)
            encoder = await asyncio.to_thread(create_encoder, local, self.observer)
            _same(model, dim, encoder.model_id, encoder.dim, directory)  # the files may change after the check
            await encoder.start()
        except asyncio.CancelledError:  # the runtime closes meanwhile
            if encoder is not None:
                await encoder.close()
            raise
        except Exception as exc:  # noqa: BLE001 - whatever stops the load (ORT's own errors too) is logged, retried
            if encoder is not None:
                await encoder.close()
            reason = exc.message if isinstance(exc, CnclipError) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._attempts[model] = _Attempt("failed", time.monotonic(), reason)
            log.error(
                "model %s (a collection swapped to it) not loaded from %s: %s; the previous generation answers, "
                "tried again in %.0f s", model, ascii(str(directory)), reason, RETRY_S,
            )  # fmt: skip
            return
        self.loaded.append(encoder)
        self.on_ready(encoder)
        with self._lock:
            self._attempts.pop(model, None)
        log.info(
            "model %s loaded from %s in %.1f s: its collections are answered by it now",
            model, ascii(str(directory)), time.perf_counter() - started,
        )  # fmt: skip

    async def close(self) -> None:
        """Cancel loads in flight and close the encoders loaded."""
        for future in list(self._tasks):
            future.cancel()
        for encoder in self.loaded:
            await encoder.close()
        self.loaded.clear()


def _same(model: str, dim: int, found: str, found_dim: int, directory: Path) -> None:
    if not same_model(model, found) or found_dim != dim:
        raise ModelError(
            f"{ascii(str(directory))} now holds {found} ({found_dim}-d), not {model} ({dim}-d): "
            "its files changed since the migration"
        )
