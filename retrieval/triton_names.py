"""The names of the Triton models `cnclip export-triton` writes and the remote encoder calls."""

from __future__ import annotations

import re

TEXT_MODEL = "cnclip_text"  # token ids at the full context length (52)
IMAGE_MODEL = "cnclip_image"  # preprocessed pixels
IMAGE_BYTES_MODEL = "cnclip_image_bytes"  # encoded files: the preprocess → cnclip_image ensemble


def text_model(length: int | None = None) -> str:
    """The text model for one length bucket: `cnclip_text_l16`; the full length is `cnclip_text`."""
    return TEXT_MODEL if length is None else f"{TEXT_MODEL}_l{length}"


def is_text_model(name: str) -> bool:
    return name == TEXT_MODEL or re.fullmatch(rf"{TEXT_MODEL}_l\d+", name) is not None
