"""The composition root: one async context manager builds, starts and closes what a process needs —
the catalog (SQL + the vector engine), the encoder(s), the collection service, the zero-shot
classifier — and the background tasks it runs. `cnclip serve` (the app's lifespan), `cnclip worker`,
every other command and the demo open a `Runtime`; nothing else writes out "open the catalog, create
the encoder, build the service, start, close".

    async with open_runtime(settings, stores="now", sweep_media=True) as rt:   # a server
        await rt.service.search.text(...)

What a caller does not need is not opened: the worker has no catalog, `cnclip stats` no encoder,
`cnclip index` opens no vector store before its final flush (`stores="on_use"`). Tests inject an
encoder or a catalog; injected ones are the caller's to close.

Encoders are kept by model id (`encoders`), so that a process can hold several models; the
settings' one is `encoder`. Background tasks (folder watchers, re-embedding jobs) are registered
with `run_in_background`: started once the runtime is open, cancelled and awaited when it closes,
before the encoders and the catalog they use.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

from indexer.config import StorageSettings
from indexer.engines import engine_record
from indexer.service.collections import CollectionService, collection_service
from indexer.service.model_loader import ModelLoader
from indexer.service.ports import Catalog
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.db import check_database, create_db_engine, upgrade, upgrade_settings_db
from indexer.storage.vectors.registry import open_vector_engine
from retrieval.config import RuntimeSettings
from retrieval.encoder import create_encoder
from retrieval.errors import EncoderUnavailable
from retrieval.machine_limits import CoreGate
from retrieval.ocr.reader import OcrReader, open_rapidocr
from retrieval.types import Encoder, EncoderObserver
from retrieval.zeroshot import ZeroShotClassifier

log = logging.getLogger(__name__)

Stores = Literal["now", "on_use"]
BackgroundJob = Callable[[], Awaitable[None]]


def open_catalog(settings: StorageSettings, *, open_stores: bool = True, sweep_media: bool = False) -> SqlCatalog:
    """Migrate the database to the newest schema and open it with the configured vector engine;
    `open_stores` also opens and reconciles every collection's store now (a server), instead of on
    first use (a process that only writes); `sweep_media` removes the upload copies and temp files
    a killed process left (`cnclip serve` and `cnclip index` at start). Blocking."""
    engine = create_db_engine(settings.sqlalchemy_url, getattr(settings, "database_pool_size", None))
    upgrade(engine)
    vectors = open_vector_engine(settings, engine.url.render_as_string(hide_password=True))
    catalog = SqlCatalog(engine, settings.data_dir, vectors, sync_interval_s=settings.sync_interval_s)
    if sweep_media:
        catalog.sweep_media()
    if open_stores:
        catalog.reconcile_all()
    return catalog


def upgrade_database(settings: StorageSettings) -> str | None:
    """`cnclip db upgrade`: create or migrate the catalog database; returns the schema revision."""
    return upgrade_settings_db(settings)


def check_storage(settings: StorageSettings) -> None:
    """What would stop a server later, raised now in one line: a SQLite file that is not a cnclip
    catalog (`DatabaseRefused`), a vector engine that cannot be used (`VectorStoreIncompatible`: a
    Milvus server older than the minimum; `VectorStoreUnavailable`: one that cannot be reached)."""
    check_database(settings.sqlalchemy_url)
    engine = open_vector_engine(settings, settings.sqlalchemy_url)
    try:
        engine.check()
    finally:
        engine.close()


def prepare_for_serving(settings: StorageSettings) -> None:
    """Process-wide setup a serving process makes for its vector engine (the registry's hook)."""
    engine_record(settings.vector_store).prepare_for_serving()


def model_encoders(settings: RuntimeSettings, observer: EncoderObserver | None = None) -> list[Encoder]:
    """The settings' encoder, then one per `CNCLIP_MODEL_DIRS` directory (a server that answers
    collections of several models, e.g. during `cnclip migrate`); not started. They share one core
    gate: all their compute threads together stay within the cores (retrieval/machine_limits.py)."""
    gate = CoreGate()
    return [create_encoder(settings, observer=observer, core_gate=gate)] + [
        model_encoder(settings, directory, observer, gate) for directory in getattr(settings, "model_dirs", [])
    ]


def model_encoder(
    settings: RuntimeSettings,
    model_dir: Any,
    observer: EncoderObserver | None = None,
    core_gate: CoreGate | None = None,
) -> Encoder:
    """An encoder of the model in `model_dir`, with the settings' runtime options (`cnclip migrate --model`).
    `ModelError` when the directory holds no usable model."""
    from pathlib import Path

    from retrieval.manifest import ModelManifest

    ModelManifest.load(Path(model_dir))  # one clear line for a directory that is not a model
    return create_encoder(
        settings.model_copy(update={"model_dir": Path(model_dir)}), observer=observer, core_gate=core_gate
    )


async def _attach_ocr(
    service: CollectionService, settings: RuntimeSettings, stack: AsyncExitStack, *, load_now: bool
) -> None:
    """Hand the service an OCR reader (retrieval/ocr/reader.py), on the provider the CLIP sessions
    would choose; it loads on first use. A warm process whose catalog has OCR collections loads it now,
    so that an engine that cannot load is one line at start (and every collection still works)."""
    open_engine = functools.partial(open_rapidocr, settings.provider, settings.device_id)
    reader = OcrReader(
        open_engine,
        threads=settings.ocr_threads,
        max_bytes=settings.max_image_bytes,
        max_pixels=settings.max_image_pixels,
    )
    stack.push_async_callback(asyncio.to_thread, reader.close)
    service.texts.reader = reader
    if load_now and any(state.ocr for state in await asyncio.to_thread(service.catalog.collections)):
        await asyncio.to_thread(reader.engine)


class Runtime:
    """What one process runs, open. Attributes are None where the caller asked for nothing."""

    def __init__(self) -> None:
        self.catalog: Catalog | None = None
        self.encoders: dict[str, Encoder] = {}  # model id -> encoder
        self.service: CollectionService | None = None
        self.zeroshot: ZeroShotClassifier | None = None
        self._jobs: dict[str, BackgroundJob] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._open = False

    @property
    def encoder(self) -> Encoder:
        """The settings' encoder (the first one opened)."""
        if not self.encoders:
            raise EncoderUnavailable("this process runs no model")
        return next(iter(self.encoders.values()))

    async def start_encoders(self) -> None:
        """Warm every encoder that is not ready yet (every bucket runs once)."""
        for encoder in self.encoders.values():
            if not encoder.ready:
                log.info("warming up the encoder (%s)", getattr(encoder, "model_id", "?"))
                await encoder.start()

    # --- background tasks ------------------------------------------------------------------------
    def run_in_background(self, name: str, job: BackgroundJob) -> None:
        """Run `job()` as a task for as long as the runtime is open: started now when it is open,
        else when it opens; cancelled and awaited on close. A task that fails is logged, not raised."""
        if name in self._jobs:
            raise ValueError(f"a background task named {name!r} runs already")
        self._jobs[name] = job
        if self._open:
            self._start(name, job)

    @property
    def background(self) -> dict[str, asyncio.Task[None]]:
        """The running background tasks by name (a copy)."""
        return dict(self._tasks)

    def _start(self, name: str, job: BackgroundJob) -> None:
        async def guarded() -> None:
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one failed job must not stop the process; its traceback is logged
                log.exception("background task %s failed", name)

        self._tasks[name] = asyncio.create_task(guarded(), name=f"cnclip:{name}")

    async def _stop_background(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _opened(self) -> None:
        self._open = True
        for name, job in self._jobs.items():
            self._start(name, job)


@asynccontextmanager
async def open_runtime(
    settings: StorageSettings,
    *,
    catalog: bool | Catalog = True,
    encoder: bool | Encoder = True,
    stores: Stores = "on_use",
    sweep_media: bool = False,
    warm: bool = True,
    observer: EncoderObserver | None = None,
) -> AsyncIterator[Runtime]:
    """Open what `settings` describe and the caller asks for; close it on exit (in reverse order:
    background tasks, encoders, catalog), also when the body raises.

    `catalog`: open one (True), use this one (injected, not closed here) or none (False).
    `encoder`: likewise; `warm=False` leaves it to `rt.start_encoders()` (a command that checks its
    arguments against the catalog before the model loads). `stores`: "now" opens and reconciles every
    collection's vector store at start (a server), "on_use" when first searched. `observer` receives
    the encoder's batch timings (the API's metrics)."""
    runtime = Runtime()
    async with AsyncExitStack() as stack:
        if catalog is True:
            opened = await asyncio.to_thread(
                open_catalog, settings, open_stores=stores == "now", sweep_media=sweep_media
            )
            stack.push_async_callback(asyncio.to_thread, opened.close)
            runtime.catalog = opened
        elif catalog is not False:
            runtime.catalog = catalog
        if encoder is True:
            for made in model_encoders(settings, observer):
                stack.push_async_callback(made.close)
                runtime.encoders.setdefault(made.model_id, made)
        elif encoder is not False:
            runtime.encoders[encoder.model_id] = encoder
        if runtime.encoders:
            # One setting sizes both text-embedding caches, so 0 turns caching of text vectors off.
            runtime.zeroshot = ZeroShotClassifier(runtime.encoder, cache_size=settings.query_cache_size)
        if runtime.catalog is not None:
            default = runtime.encoder if runtime.encoders else None
            runtime.service = collection_service(runtime.catalog, default, settings, list(runtime.encoders.values()))
            if runtime.encoders:  # a collection swapped to a model not held here: load it (no restart)
                loader = ModelLoader(
                    settings, runtime.catalog.generations.model_source, runtime.service.migration.model_loaded, observer
                )
                loader.bind(asyncio.get_running_loop())
                runtime.service.migration.model_loader = loader
                stack.push_async_callback(loader.close)
        stack.push_async_callback(runtime._stop_background)
        if runtime.service is not None:
            await _attach_ocr(runtime.service, settings, stack, load_now=warm)
        if warm:
            await runtime.start_encoders()
        runtime._opened()
        yield runtime
