"""HTTP load test of `cnclip serve` (asyncio + httpx).

    # mixed search / classify / upload, concurrency 32 for 60 s, against a running server
    python benchmarks/load_test.py mixed --url http://127.0.0.1:8000

    # or let the script start `cnclip serve` itself (settings from the CNCLIP_* environment)
    python benchmarks/load_test.py mixed --serve

    # FAISS search alone at 100k and 1M vectors, one thread vs FAISS's default threads
    python benchmarks/load_test.py faiss --sizes 100000,1000000 --factory IVF1024,Flat --nprobe 16

    # text -> image only, concurrency 8, against a big collection made with `prefill`
    python benchmarks/load_test.py prefill --collection big --items 100000   # server stopped
    python benchmarks/load_test.py text --serve --collection big --concurrency 8 --duration 30
    # the same query again and again: what a query-cache hit costs end to end
    python benchmarks/load_test.py text --serve --collection big --concurrency 1 --queries repeat

It fails (exit 1) on any 5xx and on any status other than 2xx and 429, prints p50/p99 per route and
the server's own per-stage timings, and writes the raw numbers to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.load_setup import faiss_search, percentile, prefill, random_jpeg  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"
QUERIES = [
    "穿红色裙子的女孩",
    "草地上奔跑的小狗",
    "夕阳下的海滩",
    "城市夜景",
    "一只猫在沙发上睡觉",
    "雪山和湖泊",
    "黄色的出租车",
    "a bowl of noodles",
    "桌上的咖啡杯",
    "骑自行车的人",
]
LABELS = ["猫", "狗", "汽车", "风景", "人物", "食物", "建筑", "花"]
CAPTIONS = [f"{q}（第{i}张）" for i in range(5) for q in QUERIES]
# route -> weight of the mixed workload. `healthz` (no model, no database) is the baseline measured
# in the same run: the HTTP + event-loop floor under the same load, so ratios survive a noisy machine.
MIX = {"search_text": 4, "search_image": 2, "search_image_texts": 1, "classify": 2, "upload": 1, "healthz": 1}
TEXT_ONLY = {"search_text": 9, "healthz": 1}


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    stages: dict[str, dict[str, list[float]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    errors: list[str] = field(default_factory=list)

    def record(self, route: str, response: httpx.Response, seconds: float) -> None:
        self.statuses[route][response.status_code] += 1
        if response.is_success:
            self.latencies[route].append(seconds * 1000.0)
            if route.startswith("search"):
                for stage, ms in response.json()["timings"].items():
                    self.stages[route][stage].append(ms)
        elif response.status_code != 429 and len(self.errors) < 20:
            self.errors.append(f"{route}: {response.status_code} {response.text[:200]}")


def distinct_query(rng: random.Random) -> str:
    """A short query (2–5 words, ≤ 14 tokens) that is almost never asked twice: every request
    reaches the text encoder, whatever the query cache holds."""
    words = rng.sample(QUERY_WORDS, rng.randint(2, 5))
    return "".join(words) if rng.random() < 0.8 else " ".join(words)


QUERY_WORDS = [
    *"猫狗车山海花雪树鸟鱼船桥灯门窗雨云石湖河马牛羊球书伞鞋帽茶饭面",
    "女孩",
    "城市",
    "夜景",
    "红色",
    "a",
    "dog",
    "red",
    "car",
    "sea",
]


class Workload:
    def __init__(
        self, client: httpx.AsyncClient, images: list[bytes], collection: str, seed: int, queries: str = "mixed"
    ) -> None:
        self.client = client
        self.images = images
        self.collection = collection
        self.rng = random.Random(seed)
        self.queries = queries  # "mixed": 10 common queries; "distinct": never the same; "repeat": always one

    def query(self) -> str:
        if self.queries == "distinct":
            return distinct_query(self.rng)
        if self.queries == "repeat":
            return QUERIES[0]
        return self.rng.choice(QUERIES)

    async def call(self, route: str) -> httpx.Response:
        rng, c = self.rng, self.client
        if route == "search_text":
            body = {"query": self.query(), "k": 20, "collection": self.collection}
            return await c.post("/v1/search/text", json=body)
        if route in ("search_image", "search_image_texts"):
            target = "texts" if route == "search_image_texts" else "images"
            data: dict[str, str] = {"k": "20", "target": target}
            if target == "images":
                data["collection"] = self.collection
            files = {"file": ("q.jpg", rng.choice(self.images), "image/jpeg")}
            return await c.post("/v1/search/image", files=files, data=data)
        if route == "classify":
            files = {"file": ("c.jpg", rng.choice(self.images), "image/jpeg")}
            return await c.post("/v1/classify", files=files, data={"labels": json.dumps(LABELS)})
        if route == "healthz":
            return await c.get("/healthz")
        if route == "upload":
            files = {"file": ("u.jpg", random_jpeg(rng), "image/jpeg")}
            data = {"caption": rng.choice(CAPTIONS), "tags": "上传"}
            return await c.post(f"/v1/collections/{self.collection}/items", files=files, data=data)
        raise ValueError(route)


async def run_load(
    url: str,
    routes: dict[str, int],
    concurrency: int,
    duration: float,
    collection: str,
    headers: dict[str, str],
    queries: str = "mixed",
) -> tuple[Results, float]:
    rng = random.Random(7)
    images = [random_jpeg(rng) for _ in range(32)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results = Results()
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60.0) as client:
        names, weights = list(routes), list(routes.values())
        deadline = time.perf_counter() + duration

        async def worker(seed: int) -> None:
            workload = Workload(client, images, collection, seed, queries)
            while time.perf_counter() < deadline:
                route = workload.rng.choices(names, weights)[0]
                start = time.perf_counter()
                try:
                    response = await workload.call(route)
                except httpx.HTTPError as exc:
                    results.statuses[route]["transport error"] += 1
                    results.errors.append(f"{route}: {type(exc).__name__}: {exc}")
                    continue
                results.record(route, response, time.perf_counter() - start)

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return results, elapsed


def seed_collections(url: str, collection: str, headers: dict[str, str], images: int = 64) -> None:
    """An image collection with `images` photos and a text collection, unless they exist."""
    rng = random.Random(11)
    with httpx.Client(base_url=url, headers=headers, timeout=60.0) as client:
        existing = {c["name"]: c for c in client.get("/v1/collections").raise_for_status().json()}
        if collection not in existing:
            client.post("/v1/collections", json={"name": collection, "kind": "images"}).raise_for_status()
        have = existing.get(collection, {}).get("items", 0)
        for i in range(have, images):
            files = {"file": (f"{i}.jpg", random_jpeg(rng), "image/jpeg")}
            client.post(
                f"/v1/collections/{collection}/items", files=files, data={"caption": CAPTIONS[i % len(CAPTIONS)]}
            ).raise_for_status()
        if not any(c["kind"] == "texts" for c in existing.values()):
            client.post("/v1/collections", json={"name": f"{collection}-texts", "kind": "texts"}).raise_for_status()
            client.post(f"/v1/collections/{collection}-texts/texts", json={"texts": CAPTIONS}).raise_for_status()


def report(results: Results, elapsed: float, title: str) -> dict:
    rows, summary = [], {"title": title, "seconds": round(elapsed, 1), "routes": {}}
    total = sum(sum(c.values()) for c in results.statuses.values())
    print(f"\n{title}: {total} requests in {elapsed:.1f} s = {total / elapsed:.1f} req/s")
    base = percentile(results.latencies.get("healthz", []), 50)
    print(f"{'route':<20}{'requests':>9}{'ok':>7}{'429':>6}{'other':>7}{'p50 ms':>9}{'p99 ms':>9}{'p50/healthz':>12}")
    for route in sorted(results.statuses):
        counts = results.statuses[route]
        ok = sum(n for s, n in counts.items() if isinstance(s, int) and 200 <= s < 300)
        other = sum(counts.values()) - ok - counts.get(429, 0)
        lat = results.latencies[route]
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        print(
            f"{route:<20}{sum(counts.values()):>9}{ok:>7}{counts.get(429, 0):>6}{other:>7}"
            f"{p50:>9.1f}{p99:>9.1f}{p50 / base:>12.1f}"
        )
        stage_medians = {s: round(statistics.median(v), 2) for s, v in results.stages[route].items()}
        summary["routes"][route] = {
            "requests": sum(counts.values()),
            "statuses": {str(s): n for s, n in counts.items()},
            "p50_ms": round(p50, 1),
            "p99_ms": round(p99, 1),
            "p50_over_healthz": round(p50 / base, 2),
            "server_stage_median_ms": stage_medians,
        }
        rows.append(route)
    for route in rows:
        if results.stages[route]:
            print(f"  {route} server stages (median ms): {summary['routes'][route]['server_stage_median_ms']}")
    for err in results.errors:
        print("  ERROR", err)
    summary["errors"] = results.errors
    return summary


def bad_statuses(results: Results) -> list[str]:
    """Anything but 2xx and 429 (5xx, 4xx, transport errors) is a failure of the service."""
    return [
        f"{route}: {status} x{n}"
        for route, counts in results.statuses.items()
        for status, n in counts.items()
        if not (isinstance(status, int) and (200 <= status < 300 or status == 429))
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(port: int) -> Iterator[str]:
    """`cnclip serve` in a subprocess (settings from the environment), ready when /readyz is 200."""
    log = (OUT_DIR / f"serve-{port}.log").open("w")
    proc = subprocess.Popen(["cnclip", "serve", "--port", str(port), "--log-level", "warning"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"cnclip serve exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("cnclip serve did not become ready in 600 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["mixed", "text", "prefill", "faiss"])
    parser.add_argument("--url", help="A running server; default with --serve: start one.")
    parser.add_argument("--serve", action="store_true", help="Start `cnclip serve` on a free port for the run.")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--collection", default="load")
    parser.add_argument("--items", type=int, default=100_000, help="prefill: rows to add.")
    parser.add_argument("--sizes", default="100000,1000000", help="faiss: collection sizes.")
    parser.add_argument("--dim", type=int, default=512, help="faiss: vector dimension (ViT-B-16: 512).")
    parser.add_argument("--factory", default="IVF1024,Flat", help="faiss: index factory string.")
    parser.add_argument("--nprobe", type=int, default=16, help="faiss: IVF lists visited.")
    parser.add_argument("--api-key", help="Sent as X-API-Key (writes need it when the server has one).")
    parser.add_argument(
        "--queries",
        choices=["mixed", "distinct", "repeat"],
        help="Text queries: 10 common ones (mixed; the default of `mixed`), a new one every request (distinct; "
        "the default of `text`: every query reaches the encoder), or always the same (repeat: cache hits).",
    )
    parser.add_argument("--out", type=Path, help="JSON results (default benchmarks/out/load_<mode>.json).")
    args = parser.parse_args()
    OUT_DIR.mkdir(exist_ok=True)
    if args.mode == "prefill":
        prefill(args.collection, args.items)
        return
    if args.mode == "faiss":
        faiss_search([int(n) for n in args.sizes.split(",")], args.dim, args.factory, args.nprobe)
        return
    if not args.url and not args.serve:
        parser.error("give --url of a running server, or --serve")
    headers = {"X-API-Key": args.api_key} if args.api_key else {}
    routes = MIX if args.mode == "mixed" else TEXT_ONLY
    concurrency = args.concurrency or (32 if args.mode == "mixed" else 8)
    with serve(free_port()) if args.serve else _given(args.url) as url:
        seed_collections(url, args.collection, headers)
        queries = args.queries or ("mixed" if args.mode == "mixed" else "distinct")
        asyncio.run(run_load(url, routes, min(concurrency, 4), 3.0, args.collection, headers, queries))  # warm-up
        results, elapsed = asyncio.run(
            run_load(url, routes, concurrency, args.duration, args.collection, headers, queries)
        )
    title = f"{args.mode}, concurrency {concurrency}, {args.duration:.0f} s, {queries} queries"
    summary = report(results, elapsed, title)
    summary["model_dir"] = os.environ.get("CNCLIP_MODEL_DIR", "(default)")
    (args.out or OUT_DIR / f"load_{args.mode}.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1))
    bad = bad_statuses(results)
    if bad:
        print("FAIL: statuses other than 2xx/429:", "; ".join(bad))
        sys.exit(1)


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    main()
