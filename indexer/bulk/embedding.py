"""The embed stage of the bulk pipeline (indexer/bulk/pipeline.py): where a batch's pixels are made
and its vectors come from.

With the local encoder, the reader threads decode each new file as soon as they have read it, with
the encoder's own preprocessing (`LocalEncoder.image_preprocessor`: same function, same limits, so
the vectors are the same), and the batch goes to the encoder as pixels. Why (issue 34): when the
encoder decoded, a batch's decoding began only once the whole batch had been read and routed, and its
time could not be told apart from the model's; here it starts with each file, within the readers'
bounded window, and is measured on its own (`decode_s`). It costs the same CPU per image as the
encoder's own decoding (benchmarks/bench_indexing.py `--bytes-pipeline`), and the perceptual hash comes
from that decode (a second, reduced-scale decode cost 3.6 ms of a 1024×768 photo: benchmarks/bench_phash.py). Each decode holds one of the
encoder's core permits (`LocalEncoder.core_gate`) while it runs, as the encoder's own decode workers
do: decoding and the sessions' threads together never run more threads than the cores.

Any other encoder (a remote Triton decodes on its server; a test's fake hashes the bytes) gets the
bytes, as before: `decode_s` is then 0 and the decoding is inside `encode_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import numpy as np

from indexer.bulk.reading import Decode, Decoded, PreparedFile, pixels_and_hash
from indexer.bulk.stage_clock import StageClock
from retrieval.encoder import LocalEncoder
from retrieval.errors import InvalidImage
from retrieval.types import Encoder

Failures = list[tuple[str, str]]


def pixel_decoder(encoder: Encoder, clock: StageClock) -> Decode | None:
    """The reader threads' decode for `encoder` (timed as `decode`, the perceptual hash of the same
    decode included), or None when it takes bytes."""
    if not isinstance(encoder, LocalEncoder):
        return None
    preprocess, gate = encoder.image_preprocessor(), encoder.core_gate

    def decode(data: bytes) -> Decoded:
        with contextlib.ExitStack() as held:
            with clock.timing("core_wait"):  # not reading, not decoding: the sessions had the cores
                held.enter_context(gate.hold(1))
            with clock.timing("decode"):
                return pixels_and_hash(preprocess, data)

    return decode


def decoded(batch: list[PreparedFile], decode: Decode) -> tuple[list[PreparedFile], Failures]:
    """The batch's files with pixels, decoding (worker thread) those the readers left undecoded (two
    readers raced on one sha: the routed one was not the decoded one); and the files that failed."""
    good: list[PreparedFile] = []
    failures: Failures = []
    for prepared in batch:
        if prepared.pixels is None and prepared.decode_error is None:
            try:
                prepared.pixels, phash = decode(prepared.data)
                prepared.phash = prepared.phash if prepared.phash is not None else phash
            except InvalidImage as exc:
                prepared.decode_error = exc.message
        if prepared.decode_error is not None:
            failures.append((str(prepared.entry.path), prepared.decode_error))
        else:
            good.append(prepared)
    return good, failures


async def embed_pixels(encoder: Encoder, batch: list[PreparedFile]) -> np.ndarray:
    """Vectors of decoded files, in one call; their pixels are dropped once sent (memory: only the
    batches in flight hold any)."""
    if not batch:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    pixels = np.stack([p.pixels for p in batch if p.pixels is not None])
    for prepared in batch:
        prepared.pixels = None
    return await encoder.embed_pixels(pixels)


async def embed_batch(
    encoder: Callable[[], Encoder],
    batch: list[PreparedFile],
    decode: Decode | None,
    clock: StageClock,
    failures: Failures,
) -> tuple[list[PreparedFile], np.ndarray]:
    """The files of `batch` the encoder took, and their vectors: pixels when `decode` (`pixel_decoder`),
    the files' bytes without; the files it refused are added to `failures`. `encoder()`: the
    encoder of the run's collection, asked for here (a batch of a process without one fails)."""
    model = encoder()
    if decode is not None:
        good, refused = await asyncio.to_thread(decoded, batch, decode)
        failures.extend(refused)
        with clock.sharing("encode"):
            return good, await embed_pixels(model, good)
    with clock.sharing("encode"):
        return await _embed_bytes(model, batch, failures)


async def _embed_bytes(
    encoder: Encoder, batch: list[PreparedFile], failures: Failures
) -> tuple[list[PreparedFile], np.ndarray]:
    """Vectors of the files' bytes; when the encoder refuses one image, the others are embedded alone."""
    try:
        return batch, await encoder.embed_images([p.data for p in batch])
    except InvalidImage:
        good, vectors = [], []
        for prepared in batch:
            try:
                vectors.append((await encoder.embed_images([prepared.data]))[0])
                good.append(prepared)
            except InvalidImage as exc:
                failures.append((str(prepared.entry.path), exc.message))
        return good, np.array(vectors, dtype=np.float32).reshape(len(good), encoder.dim)
