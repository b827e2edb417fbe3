"""The project's error types. Each carries the HTTP status and a stable code the API reports.

Every layer raises these (never a library's own exception) so that the API has one handler
and users always see a human message, never a traceback or raw exception text.
"""

from __future__ import annotations


class CnclipError(Exception):
    """Base of every error this project raises on purpose."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(CnclipError):
    """The request is well-formed but its content cannot be used."""

    status_code = 422
    code = "invalid_input"


class InvalidImage(InvalidInput):
    """Bytes that are not a usable image: corrupt, truncated, not an image, too many pixels."""

    code = "invalid_image"


class PayloadTooLarge(InvalidImage):
    """More bytes than the configured limit."""

    status_code = 413
    code = "payload_too_large"


class NotFound(CnclipError):
    status_code = 404
    code = "not_found"


class Conflict(CnclipError):
    status_code = 409
    code = "conflict"


class Unauthorized(CnclipError):
    status_code = 401
    code = "unauthorized"


class Overloaded(CnclipError):
    """The batcher's queue is full; the client should retry after `retry_after` seconds."""

    status_code = 429
    code = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelError(CnclipError):
    """A model directory or graph is missing, corrupt or inconsistent with its manifest."""

    status_code = 500
    code = "model_error"


class EncoderUnavailable(CnclipError):
    """The encoder (local sessions or a remote Triton server) cannot serve right now."""

    status_code = 503
    code = "encoder_unavailable"
