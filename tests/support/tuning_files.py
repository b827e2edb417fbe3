"""Tuning files written by hand for the tests of what reads them (the encoder, the memory budget, the
benchmarks), and an encoder started once to see what it planned from one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from api.config import Settings
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest
from retrieval.tuning import machine_fingerprint


def tuning_for(model: Path, **towers: dict[str, Any]) -> dict[str, Any]:
    """A hand-written tuning file for `model` on this machine."""
    default = {"backend": "onnxruntime", "device": "cpu", "precision": "int8", "streams": 1, "shapes": {}}
    return {
        "format": 1,
        "model_id": ModelManifest.load(model).model_id,
        "created": "2026-12-04T00:00:00Z",
        "fingerprint": machine_fingerprint(),
        "towers": {"image": {**default, **towers.get("image", {})}, "text": {**default, **towers.get("text", {})}},
    }


def start(settings: Settings) -> LocalEncoder:
    """An encoder on `settings`, started (its plans made, its sessions opened) and closed again."""

    async def main() -> LocalEncoder:
        encoder = LocalEncoder(settings)
        await encoder.start()
        await encoder.close()
        return encoder

    return asyncio.run(main())
