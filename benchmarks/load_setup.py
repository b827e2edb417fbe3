"""What `benchmarks/load_test.py` measures against: a catalog prefilled with synthetic rows (`prefill`),
bare FAISS search times at several sizes (`faiss`), and the small helpers both use."""

from __future__ import annotations

import io
import random
import time

import numpy as np
from PIL import Image


def random_jpeg(rng: random.Random, size: int | tuple[int, int] = 160) -> bytes:
    """A blocky random image, `size` square or (width, height): compresses like a photo (a few KB),
    distinct bytes every call."""
    cells = np.frombuffer(rng.randbytes(8 * 8 * 3), dtype=np.uint8).reshape(8, 8, 3)
    img = Image.fromarray(cells, "RGB").resize(
        size if isinstance(size, tuple) else (size, size), Image.Resampling.BILINEAR
    )
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def prefill(collection: str, items: int, batch: int = 5000) -> None:
    """Add `items` synthetic image rows with random unit vectors straight through the catalog (the
    server must be stopped: one writer). Rows point at one shared JPEG; only search cost matters."""
    from api.config import Settings
    from indexer.domain.records import NewImage
    from indexer.runtime import open_catalog
    from retrieval.manifest import ModelManifest

    settings = Settings()
    manifest = ModelManifest.load(settings.model_dir)
    model_id, dim = manifest.name, manifest.embed_dim  # the encoder reports manifest.name as model_id
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    photo = settings.data_dir / "prefill.jpg"
    photo.write_bytes(random_jpeg(random.Random(1), 224))
    rng = np.random.default_rng(0)
    catalog = open_catalog(settings)
    try:
        names = {c.name: c for c in catalog.list_collections()}
        if collection not in names:
            catalog.create_collection(collection, "images", model_id, dim, settings.index_factory)
        start, have = time.perf_counter(), names[collection].items if collection in names else 0
        for offset in range(have, items, batch):
            n = min(batch, items - offset)
            vectors = rng.standard_normal((n, dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            rows = [
                NewImage(
                    data=b"",
                    path=str(photo),
                    caption=f"合成图片 {offset + i}",
                    sha256=f"prefill-{offset + i}",
                    mime="image/jpeg",
                    width=224,
                    height=224,
                )
                for i in range(n)
            ]
            catalog.add_images(collection, rows, vectors)
            print(f"\r{offset + n}/{items} rows, {time.perf_counter() - start:.0f} s", end="", flush=True)
        print()
    finally:
        catalog.close()


def faiss_search(sizes: list[int], dim: int, factory: str, nprobe: int, queries: int = 200) -> None:
    """Single-query FAISS search time (the `search` stage without SQL) at several collection sizes,
    with one OpenMP thread (what `cnclip serve` uses) beside FAISS's default, in the same run."""
    import faiss

    rng = np.random.default_rng(0)
    default_threads = faiss.omp_get_max_threads()
    for n in sizes:
        base = rng.standard_normal((n, dim), dtype=np.float32)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        started = time.perf_counter()
        if not index.is_trained:
            index.train(base[rng.choice(n, min(n, 64 * 1024), replace=False)])
        index.add(base)
        build_s = time.perf_counter() - started
        if hasattr(index, "nprobe"):
            index.nprobe = nprobe
        qs = rng.standard_normal((queries, dim), dtype=np.float32)
        qs /= np.linalg.norm(qs, axis=1, keepdims=True)
        line = [f"{factory} n={n:,} dim={dim} (built in {build_s:.0f} s)"]
        for threads in (1, default_threads):
            faiss.omp_set_num_threads(threads)
            times = []
            for q in qs:
                t = time.perf_counter()
                index.search(q.reshape(1, -1), 80)
                times.append((time.perf_counter() - t) * 1000.0)
            line.append(f"{threads} thread(s): p50 {percentile(times, 50):.2f} ms, p99 {percentile(times, 99):.2f} ms")
        print(" | ".join(line), flush=True)
        del base, index
