"""The project's error types. Each carries a stable `code` and a human `message`; none knows HTTP.

Every layer raises these (never a library's own exception). The API maps them to HTTP statuses
in one table (`api/errors.py`), so the model runtime stays free of web concepts.
"""

from __future__ import annotations


class CnclipError(Exception):
    """Base of every error this project raises on purpose."""

    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(CnclipError):
    """The request is well-formed but its content cannot be used."""

    code = "invalid_input"


class InvalidImage(InvalidInput):
    """Bytes that are not a usable image: corrupt, truncated, not an image, too many pixels."""

    code = "invalid_image"


class ImageTooLarge(InvalidImage):
    """An image whose header declares more pixels than the configured limit (`CNCLIP_MAX_IMAGE_PIXELS`, or
    a side over 65,535): readable, but too large to decode. Its own code, so that a client (the web UI)
    says "too large", not "cannot read"."""

    code = "image_too_large"


class PayloadTooLarge(InvalidImage):
    """More bytes than the configured limit."""

    code = "payload_too_large"


class NotFound(CnclipError):
    """The named collection, item, label set or model does not exist."""

    code = "not_found"


class Conflict(CnclipError):
    """The request clashes with what exists (a collection of that name, say)."""

    code = "conflict"


class Overloaded(CnclipError):
    """The batcher's queue is full; the client should retry after `retry_after` seconds."""

    code = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelError(CnclipError):
    """A model directory or graph is missing, corrupt or inconsistent with its manifest."""

    code = "model_error"


class EncoderUnavailable(CnclipError):
    """The encoder (local sessions or a remote Triton server) cannot serve right now."""

    code = "encoder_unavailable"
