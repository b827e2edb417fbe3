"""Text length buckets on the real graphs: what a shorter text graph saves, and how to batch mixed lengths.

    python benchmarks/bench_lengths.py --model DIR [--precision int8] [--rounds 5] [--seconds 1.5]

In one run, rounds interleaved (every configuration once per round; medians with min/max):
1. **graphs**: latency of each text graph (batch × length) with the server's session options (one
   stream on all cores), and the speed-up of each length over the 52-token graph at the same batch;
2. **mixed batches**: a batch whose texts need two lengths, run (a) as one batch at the longest
   length — what the batcher does when it merges concurrent requests — or (b) split into one batch
   per length, each cut as the batcher cuts it (`choose_batch`);
3. **encoder**: `LocalEncoder` with closed-loop clients sending one short query each (2–6 words,
   ≤ 14 tokens), at concurrency 1 and 16, with every length bucket — each text at its own length on
   the one shape-dynamic session (the default), and padded to its bucket — against
   `CNCLIP_TEXT_LENGTHS=[52]` (the 52-token graphs only). The query cache is off: every request reaches the model.
Needs a model directory converted with `--text-lengths` (e.g. `cnclip convert --arch ViT-B-16
--random-init --out DIR --precision fp32,int8`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retrieval.backends.base import SessionConfig, cpu_thread_plan  # noqa: E402
from retrieval.batcher import assemble, choose_batch  # noqa: E402
from retrieval.config import RuntimeSettings  # noqa: E402
from retrieval.encoder import LocalEncoder  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.sessions import OrtSession  # noqa: E402
from retrieval.tokenizer import tokenize  # noqa: E402
from retrieval.toolchain.bench import percentiles, text_payloads  # noqa: E402

QUERY = "穿红色裙子的女孩"  # 10 tokens
CAPTION = "一张清晰的穿红色裙子的女孩在公园里放风筝的照片"  # 25 tokens
LONG = "雨后的城市街道倒映着霓虹灯，行人撑着伞匆匆走过十字路口，远处的高楼亮着灯"  # 38 tokens


def median_min_max(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def time_runs(fn, seconds: float) -> float:
    """Median seconds of one call, calling `fn` back to back for about `seconds` (at least 3 calls)."""
    fn()  # warm
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def open_sessions(manifest: ModelManifest, precision: str, batches: list[int]) -> dict[tuple[int, int], OrtSession]:
    cores = cpu_thread_plan(1, 0)[0]
    config = SessionConfig(provider="cpu", precision=precision, cores=cores, spin=True)
    sessions = {}
    for length in manifest.text_lengths(precision):
        for batch in batches:
            path = manifest.graph_path("text", precision, batch, length)
            sessions[(batch, length)] = OrtSession(path, config, "text", "text_features")
    return sessions


def ids_for(batch: int, length: int) -> np.ndarray:
    text = QUERY if length <= 16 else CAPTION if length <= 32 else LONG
    return tokenize([text] * batch, length)


def bench_graphs(sessions, rounds: int, seconds: float) -> dict[tuple[int, int], list[float]]:
    results: dict[tuple[int, int], list[float]] = {key: [] for key in sessions}
    for _ in range(rounds):
        for key, session in sessions.items():
            x = ids_for(*key)
            results[key].append(time_runs(lambda s=session, x=x: s.run(x), seconds) * 1000)
    return results


def run_split(sessions, buckets: list[int], groups: list[np.ndarray]) -> None:
    """Each length group cut into batches the way the batcher cuts a queue of that many rows."""
    for group in groups:
        start = 0
        while start < len(group):
            rows, bucket = choose_batch(len(group) - start, buckets)
            sessions[(bucket, group.shape[1])].run(assemble([group[start : start + rows]], bucket - rows))
            start += rows


def bench_mixes(
    sessions, buckets: list[int], rounds: int, seconds: float
) -> list[tuple[str, list[float], list[float]]]:
    lengths = sorted({n for _, n in sessions})
    short, middle = lengths[0], lengths[1] if len(lengths) > 2 else lengths[-1]
    mixes = []
    for total, long_rows in ((4, 1), (8, 2), (16, 8), (16, 2)):
        if total not in buckets:
            continue
        groups = [tokenize([QUERY] * (total - long_rows), short), tokenize([CAPTION] * long_rows, middle)]
        label = f"{total - long_rows} × {short} + {long_rows} × {middle} tokens"
        mixes.append((label, total, groups))
    out = []
    for label, total, groups in mixes:
        merged_ms, split_ms = [], []
        for _ in range(rounds):
            merged = assemble(groups, 0)
            merged_ms.append(time_runs(lambda m=merged, t=total: sessions[(t, m.shape[1])].run(m), seconds) * 1000)
            split_ms.append(time_runs(lambda g=groups: run_split(sessions, buckets, g), seconds) * 1000)
        out.append((label, merged_ms, split_ms))
    return out


async def encoder_point(
    settings: RuntimeSettings, concurrency: int, seconds: float, tight: bool = True
) -> tuple[float, float]:
    """(queries/s, p50 ms) of closed-loop clients each sending one short query at a time; `tight`
    False: every text padded to its length bucket even where the session runs any length."""
    encoder = LocalEncoder(settings)
    await encoder.start()
    encoder.tight_text = encoder.tight_text and tight
    texts = text_payloads(4096, seed=3)
    latencies: list[float] = []
    try:
        for text in texts[:8]:
            await encoder.embed_texts([text])  # settle threads
        deadline = time.perf_counter() + seconds

        async def client(offset: int) -> None:
            i = offset
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                await encoder.embed_texts([texts[i % len(texts)]])
                latencies.append(time.perf_counter() - start)
                i += concurrency

        start = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        await encoder.close()
    return len(latencies) / elapsed, percentiles(latencies)[0]


def bench_encoder(model: Path, precision: str, rounds: int, seconds: float, concurrencies: list[int]):
    base = RuntimeSettings(
        _env_file=None,  # type: ignore[call-arg]
        model_dir=model,
        provider="cpu",
        precision=precision,
        buckets=[1, 4, 8, 16],
        query_cache_size=0,
    )
    configs = {
        "every length, each text at its own (the default)": (base, True),
        "every length, padded to its bucket": (base, False),
        "52 only": (base.model_copy(update={"text_lengths": [52]}), True),
    }
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, (settings, tight) in configs.items():
            for concurrency in concurrencies:
                results.setdefault((name, concurrency), []).append(
                    asyncio.run(encoder_point(settings, concurrency, seconds, tight))
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="per graph measurement")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--encoder-seconds", type=float, default=5.0)
    parser.add_argument("--encoder-rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: graphs, mixes, encoder")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    manifest = ModelManifest.load(args.model, verify=False)
    batches = [int(b) for b in args.batches.split(",")]
    load_before = os.getloadavg()[0]
    print(f"# bench_lengths: {manifest.name}, {args.precision}, lengths {manifest.text_lengths(args.precision)}")
    print(f"date {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; load average {load_before:.2f} at start")
    print(f"command: python {' '.join(sys.argv)}\n")
    if not skip >= {"graphs", "mixes"}:
        have = manifest.towers["text"].buckets(args.precision)
        sessions = open_sessions(manifest, args.precision, [b for b in have if b <= 16])
    if "graphs" not in skip:
        graphs = bench_graphs({k: s for k, s in sessions.items() if k[0] in batches}, args.rounds, args.seconds)
        print(f"## Text graphs, {args.precision}, ms per run (median of {args.rounds} rounds, min–max)\n")
        print("| batch | length | ms per run | texts/s | vs 52 tokens |\n| --- | --- | --- | --- | --- |")
        for (batch, length), values in sorted(graphs.items()):
            full = statistics.median(graphs[(batch, manifest.context_length)])
            ms = statistics.median(values)
            print(f"| {batch} | {length} | {median_min_max(values)} | {batch * 1000 / ms:.1f} | {full / ms:.2f}× |")
        print()
    if "mixes" not in skip:
        mixes = bench_mixes(sessions, sorted({b for b, _ in sessions}), args.rounds, args.seconds)
        print("## Mixed lengths: one batch at the longest length vs one batch per length (ms)\n")
        print("| texts | merged at the longest | split by length | split / merged |\n| --- | --- | --- | --- |")
        for label, merged, split in mixes:
            ratio = statistics.median(split) / statistics.median(merged)
            print(f"| {label} | {median_min_max(merged)} | {median_min_max(split)} | {ratio:.2f} |")
        print()
    if "encoder" not in skip:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
        results = bench_encoder(args.model, args.precision, args.encoder_rounds, args.encoder_seconds, concurrencies)
        print(f"## LocalEncoder, short queries (median of {args.encoder_rounds} rounds, min–max)\n")
        print(
            "| text graphs | concurrency | queries/s | p50 ms | queries/s vs 52 only |\n| --- | --- | --- | --- | --- |"
        )
        for (name, concurrency), points in results.items():
            qps = [p[0] for p in points]
            p50 = [p[1] for p in points]
            base = statistics.median(q for q, _ in results[("52 only", concurrency)])
            print(
                f"| {name} | {concurrency} | {median_min_max(qps)} | {median_min_max(p50)} "
                f"| {statistics.median(qps) / base:.2f}× |"
            )
        print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
