"""Downloading an official Chinese-CLIP checkpoint, resumably and verified (`cnclip models pull NAME`,
cli/models.py).

The file goes to `DIR/<file>.part` first; an interrupted download resumes with an HTTP Range request;
only a complete file whose size (Content-Length / Content-Range) and sha256 match is renamed into
place. Hugging Face sends the sha256 of LFS files as the ETag, so it is checked whenever the server
states it (or when `--sha256` is given).
"""

from __future__ import annotations

import errno
import hashlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from retrieval.errors import CnclipError

# (bytes of the file there so far, its size when the server states it): a progress bar's update.
DownloadProgress = Callable[[int, int | None], None]

CHUNK = 1 << 20
SHA256_RE = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')


class DownloadError(CnclipError):
    """A checkpoint could not be downloaded or failed verification."""

    code = "download_failed"


@dataclass(frozen=True)
class Checkpoint:
    name: str  # the architecture name `cnclip convert --arch` takes
    repo: str  # Hugging Face repository under OFA-Sys (ModelScope: AI-ModelScope)
    file: str
    size_hint: str


# The released checkpoints, as cn_clip/clip/utils.py lists them.
CHECKPOINTS = {
    c.name: c
    for c in (
        Checkpoint("ViT-B-16", "chinese-clip-vit-base-patch16", "clip_cn_vit-b-16.pt", "~0.7 GB"),
        Checkpoint("ViT-L-14", "chinese-clip-vit-large-patch14", "clip_cn_vit-l-14.pt", "~1.6 GB"),
        Checkpoint("ViT-L-14-336", "chinese-clip-vit-large-patch14-336px", "clip_cn_vit-l-14-336.pt", "~1.6 GB"),
        Checkpoint("ViT-H-14", "chinese-clip-vit-huge-patch14", "clip_cn_vit-h-14.pt", "~3.6 GB"),
        Checkpoint("RN50", "chinese-clip-rn50", "clip_cn_rn50.pt", "~0.3 GB"),
    )
}


def checkpoint_url(checkpoint: Checkpoint, base_url: str) -> str:
    """The download URL: `{base}/OFA-Sys/{repo}/resolve/main/{file}`, or the base as a {repo}/{file} template."""
    if "{repo}" in base_url or "{file}" in base_url:
        return base_url.format(repo=checkpoint.repo, file=checkpoint.file)
    return f"{base_url.rstrip('/')}/OFA-Sys/{checkpoint.repo}/resolve/main/{checkpoint.file}"


def _expected_sha256(response: httpx.Response) -> str | None:
    for header in ("x-linked-etag", "etag"):
        match = SHA256_RE.match(response.headers.get(header, "").strip().lower())
        if match:
            return match.group(1)
    return None


def _total_size(response: httpx.Response, offset: int) -> int | None:
    if response.status_code == 206:
        match = re.match(r"bytes \d+-\d+/(\d+)", response.headers.get("content-range", ""))
        return int(match.group(1)) if match else None
    length = response.headers.get("content-length")
    return int(length) + offset if length and length.isdigit() else None


def _hash_prefix(path: Path) -> hashlib._Hash:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest


def file_sha256(path: Path) -> str:
    """The sha256 of a file on disk (a checkpoint already downloaded)."""
    return _hash_prefix(path).hexdigest()


def _kept_part(part: Path) -> str:
    """What a failed download leaves for the next one to resume: said only when there is something
    (an empty `.part` is removed, so that no message promises bytes that are not there)."""
    size = part.stat().st_size if part.is_file() else 0
    if size == 0:
        part.unlink(missing_ok=True)
        return ""
    return f" The partial file {part} ({size:,} bytes) is kept: the same command resumes it."


def download(
    url: str,
    target: Path,
    sha256: str | None = None,
    on_progress: DownloadProgress | None = None,
    timeout: float = 30.0,
) -> Path:
    """Download `url` to `target` (resuming `target.part`), verify size and sha256, return `target`.
    `on_progress(done, total)` is called as the bytes arrive."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    host = urlsplit(url).netloc
    try:
        with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            if response.status_code == 416 and offset:  # the .part is already complete (or longer than the file)
                part.unlink()
                return download(url, target, sha256, on_progress, timeout)
            _check_response(response, url, host)
            if offset and response.status_code != 206:
                offset = 0  # the server ignored the Range header: start again
            total = _total_size(response, offset)
            expected = (sha256 or _expected_sha256(response) or "").lower() or None
            _check_room(target.parent, total, offset)
            digest = _hash_prefix(part) if offset else hashlib.sha256()
            report = on_progress or (lambda _done, _total: None)
            done = offset
            report(done, total)
            with part.open("ab" if offset else "wb") as out:
                for block in response.iter_bytes(CHUNK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    report(done, total)
    except httpx.TransportError as exc:
        raise DownloadError(
            f"cannot download from {host}: {exc.__class__.__name__}: {exc} — no network? "
            f"Set CNCLIP_MODEL_BASE_URL to a reachable mirror, or download the file by hand "
            f"and run `cnclip convert --checkpoint FILE`.{_kept_part(part)}"
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DownloadError(
                f"disk full while writing {part}; free space and run the command again to resume"
            ) from exc
        raise DownloadError(f"cannot write {part}: {exc}") from exc
    _check_complete(part, target, total, digest.hexdigest(), expected)
    part.replace(target)
    return target


def _check_response(response: httpx.Response, url: str, host: str) -> None:
    if response.status_code == 404:
        raise DownloadError(f"not found (HTTP 404): {url} — check the model name or CNCLIP_MODEL_BASE_URL")
    if response.status_code >= 400:
        raise DownloadError(f"HTTP {response.status_code} from {host} for {url}")


def _check_room(folder: Path, total: int | None, offset: int) -> None:
    """A disk too small for what is left to download is said before anything is written."""
    if total is None:
        return
    free = shutil.disk_usage(folder).free
    if total - offset > free:
        raise DownloadError(
            f"disk full: {folder} has {free / 1e9:.2f} GB free, the download needs {(total - offset) / 1e9:.2f} GB more"
        )


def _check_complete(part: Path, target: Path, total: int | None, actual: str, expected: str | None) -> None:
    """The size the server stated and the sha256 it (or --sha256) stated; a corrupt file is deleted."""
    size = part.stat().st_size
    if total is not None and size != total:
        raise DownloadError(f"incomplete download: {size} of {total} bytes; run the command again to resume")
    if expected and actual != expected:
        part.unlink()
        raise DownloadError(
            f"checksum mismatch for {target.name}: got sha256 {actual[:16]}…, expected {expected[:16]}… "
            "— the corrupt file was deleted; run the command again"
        )
