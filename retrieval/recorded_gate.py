"""What the quality gate recorded in a model directory's manifest (`extra.gate`), as the runtime reads it.

The gate itself measures (retrieval/toolchain/gate.py: `cnclip convert` and `cnclip tune` run it);
the runtime only reads its verdicts, so that it never picks an engine, precision and tower the record
says failed (retrieval/tower_plan.py). This module is that reading, apart from the measuring, so the
runtime core needs nothing of the toolchain.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def recorded_failures(extra: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """(backend, precision, tower) -> reason, for each result a manifest's `extra.gate` says failed.

    What the record says is taken only when it is well formed; an unreadable record is ignored
    with a warning (it can only forbid, never allow, so ignoring it is today's behaviour)."""
    record = extra.get("gate")
    if record is None:
        return {}
    results = record.get("results") if isinstance(record, dict) else None
    if not isinstance(results, list):
        log.warning("manifest: extra.gate is not {'results': [...]}; ignored")
        return {}
    failed = {}
    for item in results:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("backend", "precision", "tower")
        ):
            log.warning("manifest: a gate result is malformed; ignored: %.200r", item)
            continue
        if item.get("passed") is not True:
            failed[(item["backend"], item["precision"], item["tower"])] = str(item.get("reason", "failed"))[:200]
    return failed
