"""A victim's image search beside one request of many large images (issue 28, item 2).

    python benchmarks/bench_fair_decode.py [--side 7000] [--images 40] [--repeats 1]

A live server (uvicorn, the toy model's local encoder on the CPU, one indexed image) in this process.
For each pool the decode workers can be shared by: `fair` (retrieval/fair_pool.py, what the server
runs) and `fifo` (the same workers serving requests in arrival order, as a plain thread pool did
before), it measures the victim's `/v1/search/image` alone, then started while a `/v2`
`cnclip_image_bytes` request of `--images` PNGs of `--side`² zeros is being decoded (the request
budget raised to admit it), and the bomb request itself. Then, with the default budget, how long
the issue's request (150 × 7000² zeros) takes to be refused. Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

import retrieval.encoder  # noqa: E402
from api import create_app  # noqa: E402
from api.config import Settings  # noqa: E402
from retrieval.fair_pool import FairPool  # noqa: E402
from retrieval.toolchain.toy_model import write_toy_model  # noqa: E402
from tests.support.api_helpers import image_bytes, open_test_catalog  # noqa: E402
from tests.support.decode_load import v2_bytes_request, victim_beside_bomb, zero_png  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402


class FifoPool(FairPool):
    """The same workers, serving each request's images to the end before the next request's: the
    order a plain `ThreadPoolExecutor` gave (the baseline)."""

    def _next_job(self) -> Any:
        queue: deque[Any] = self._fresh
        while queue:
            request = queue[0]
            if request.jobs:
                if self.started.maxlen:
                    self.started.append(request.label)
                return request.jobs.popleft()
            queue.popleft()
        return None


def _decoding(pool: FairPool) -> bool:
    return pool.queued > 0


def _serve(settings: Settings) -> Any:
    catalog = open_test_catalog(settings)
    app = create_app(settings, catalog=catalog)
    live = LiveServer(app)
    live.__enter__()
    with httpx.Client(base_url=live.base_url, timeout=60) as c:
        c.post("/v1/collections", json={"name": "photos", "kind": "images"}).raise_for_status()
        files = {"file": ("p.png", image_bytes((200, 30, 40)), "image/png")}
        c.post("/v1/collections/photos/items", files=files).raise_for_status()
    return live, app, catalog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=7000, help="each bomb image is side × side zeros")
    parser.add_argument("--images", type=int, default=40, help="images in the bomb request")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fair-decode-"))
    model = work / "toy-model"
    model.mkdir()
    write_toy_model(model)
    bomb = [zero_png(args.side)] * args.images
    victim = image_bytes((200, 30, 40))
    print(
        f"# {os.cpu_count()} CPUs; bomb: {args.images} PNGs of {args.side}×{args.side} zeros ({len(bomb[0]):,} B each)"
    )
    for name, pool in (("fair", FairPool), ("fifo", FifoPool)):
        retrieval.encoder.FairPool = pool  # type: ignore[misc]  # the pool the encoder builds at start
        settings = Settings(
            _env_file=None,
            model_dir=model,
            data_dir=work / name,
            provider="cpu",
            max_request_pixels=args.images * args.side * args.side,
        )
        live, app, catalog = _serve(settings)
        try:
            decode_pool = app.state.encoder._preprocess_pool
            workers = decode_pool.workers
            runs = [
                victim_beside_bomb(live.base_url, bomb, victim, partial(_decoding, decode_pool))
                for _ in range(args.repeats)
            ]
        finally:
            live.__exit__(None, None, None)
            catalog.close()
        for run in runs:
            assert run.bomb_status == 200, run
        print(
            f"{name}: {workers} decode workers; victim alone {statistics.median(r.victim_alone for r in runs):.3f} s, "
            f"beside the bomb {statistics.median(r.victim_beside for r in runs):.3f} s "
            f"(started {statistics.median(r.victim_started_after for r in runs):.2f} s into it); "
            f"bomb request {statistics.median(r.bomb for r in runs):.2f} s"
        )
    retrieval.encoder.FairPool = FairPool  # type: ignore[misc]
    live, app, catalog = _serve(Settings(_env_file=None, model_dir=model, data_dir=work / "budget", provider="cpu"))
    try:
        body, headers = v2_bytes_request([zero_png(7000)] * 150)
        with httpx.Client(base_url=live.base_url, timeout=600) as c:
            started = time.perf_counter()
            refused = c.post("/v2/models/cnclip_image_bytes/infer", content=body, headers=headers)
            elapsed = time.perf_counter() - started
    finally:
        live.__exit__(None, None, None)
        catalog.close()
    print(
        f"default budget: 150 × 7000² zeros ({len(body):,} B body) answered {refused.status_code} in {elapsed:.3f} s: "
        f"{refused.json()['error']}"
    )


if __name__ == "__main__":
    main()
