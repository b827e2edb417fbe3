"""Everything about a local model that can stop a process, checked before it starts, in one line:
the model directory in full (`ModelManifest.load`: manifest schema with bounded numbers, towers,
files regular and of plausible size, graphs of the manifest's shapes, sha256 of every file), the
tuning file a setting names, and each tower's plan (backend, device, precision, buckets, streams and
the memory budget: `CNCLIP_MEMORY_BUDGET_MB=1` is refused here, not at warm-up).

`cnclip serve` and `cnclip worker` call `check_local_model` for `CNCLIP_MODEL_DIR` and every
`CNCLIP_MODEL_DIRS` directory before they bind their port; `cnclip migrate --model` for its model
before it touches the collection. Nothing is opened: no session, no thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from retrieval.config import RuntimeSettings
from retrieval.errors import ModelError
from retrieval.manifest import ModelManifest
from retrieval.regular_file import UnusableFile, check_regular
from retrieval.tuning import MAX_BYTES


def check_local_model(settings: RuntimeSettings) -> ModelManifest:
    """The manifest of `settings.model_dir`, checked with everything above; a `CnclipError` (one line)
    says what stops it."""
    from retrieval.encoder import LocalEncoder

    if settings.tuning_file is not None:  # a setting naming a FIFO or a device is a bad setting
        try:
            check_regular(settings.tuning_file, MAX_BYTES)
        except UnusableFile as exc:
            if not exc.missing:  # absent: the defaults run, as documented
                raise ModelError(f"CNCLIP_TUNING_FILE: {exc.message}") from None
    manifest = ModelManifest.load(settings.model_dir, verify=True)
    encoder = LocalEncoder(settings, manifest=manifest)
    with _quiet():  # the plan's own lines are logged once, when the server plans for real
        encoder._plan()  # noqa: SLF001 - the plan alone: what start() does before it opens sessions
    return manifest


@contextmanager
def _quiet() -> Iterator[None]:
    """No log line while the check plans (a start-up check runs before any other thread)."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)
