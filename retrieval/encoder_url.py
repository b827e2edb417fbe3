"""`CNCLIP_ENCODER`'s URL, parsed once: by the settings at start (one line for a bad value, before the
port is bound) and by the remote encoder (retrieval/remote.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

from retrieval.errors import ModelError


def parse_encoder_url(value: str) -> str:
    """`triton://host:port` or `http://host:port` → `host:port` (what tritonclient wants). Anything
    else is one `ModelError`: a port out of 1..65535, a broken `[` IPv6 literal, a host that is not
    printable ASCII (bytes that are not UTF-8 in the environment) — never urllib's `ValueError` or
    the HTTP client's error at start-up."""
    shown = ascii(value)[1:-1] if not value.isascii() else value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:  # "Port out of range 0-65535", "Invalid IPv6 URL", a port that is no number
        raise ModelError(f"encoder URL '{shown}' is not a URL ({exc})") from None
    if parts.scheme not in ("triton", "http") or not parts.hostname:
        raise ModelError(f"encoder URL must look like triton://host:port or http://host:port, got '{shown}'")
    if not parts.hostname.isascii() or not parts.hostname.isprintable():
        raise ModelError(f"encoder URL '{shown}': the host must be printable ASCII (a name or an address)")
    if port == 0:
        raise ModelError(f"encoder URL '{shown}': port 0 is no server's port")
    if parts.path not in ("", "/"):
        raise ModelError(f"encoder URL '{shown}' must not have a path; the v2 routes are fixed")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port or 8000}"
