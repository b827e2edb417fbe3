"""Throughput against concurrency: `cnclip worker` and `cnclip serve` (their /v2) beside `cnclip triton-server`
serving `cnclip export-triton --backend python` of the same model and precision — the seed's table:

    config | concurrency | infer/sec | latency usec (p50, p99)

    # the full quiet measurement (about 25 min with ViT-B-16; see BENCHMARKS.md)
    python benchmarks/bench_concurrency.py --model /work/bench-models/vitb16 --precision int8

    # a check that it runs (seconds per cell, not numbers to keep)
    python benchmarks/bench_concurrency.py --duration 2 --warmup 0.5 --rounds 1 --concurrency 1,2

Paths, each a batch-1 KServe v2 request with binary tensors: `text` (distinct Chinese queries, token
ids: to `cnclip_text` of our servers, which pick the length bucket themselves, and to the shortest
`cnclip_text_lN` that holds the query on Triton, as the remote encoder sends), `image-bytes` (JPEG
files to `cnclip_image_bytes`: decoding on the server, Triton's preprocess → cnclip_image ensemble),
`image-tensor` (preprocessed FP32 pixels to `cnclip_image`), and `text-json` (JSON tensors; not by default).
The queries are 7-8 tokens ("猫狗的照片": [CLS], the characters, [SEP]): our servers run them at that
length on ONNX Runtime's one shape-dynamic session, Triton in its 16-token graph. `--query-tokens 16`
sends queries of exactly 16 tokens, where both run the same work.

The load comes from Triton's `perf_analyzer` where it runs, else (one line says why) from the
project's closed-loop client (retrieval/toolchain/http_load.py): N clients, each sending its next request
when the previous one is answered, one window of `--duration` after `--warmup`; 20,000 distinct
queries sent in turn through the whole run, so no cell repeats one. All servers run at once and the
cells are interleaved — every round visits every concurrency × path × server, the servers' order
rotating — so that a load spike hits all configurations alike; the table gives the median over
`--rounds` with the min–max of infer/sec, then the two verdicts the issue asks for. The query cache
(CNCLIP_QUERY_CACHE_SIZE, docs/settings.md) would answer repeated texts without the model: it is off
unless `--query-cache N`, and the header says which, from the servers' own /metrics after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import re
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.load_setup import random_jpeg  # noqa: E402
from benchmarks.load_test import OUT_DIR, QUERY_WORDS  # noqa: E402
from benchmarks.machine import machine  # noqa: E402
from benchmarks.perf_analyzer_check import PerfAnalyzer, find_perf_analyzer, run_cell, write_input_data  # noqa: E402
from retrieval.config import SHIPPED_MODEL_DIR, RuntimeSettings  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.preprocess import preprocess_image  # noqa: E402
from retrieval.text_lengths import split_by_length  # noqa: E402
from retrieval.tokenizer import tokenize  # noqa: E402
from retrieval.toolchain.http_load import RequestMaker, binary_body, closed_loop, http_request, in_turn  # noqa: E402
from retrieval.triton_names import IMAGE_BYTES_MODEL, IMAGE_MODEL, text_model  # noqa: E402
from tests.support.cli_server import CliServer  # noqa: E402
from tests.support.kserve_server import free_port  # noqa: E402
from tests.support.real_triton import RealTriton  # noqa: E402

SERVERS = ("worker", "serve", "triton")
PATHS = ("text", "image-bytes", "image-tensor", "text-json")
# One Chinese character per digit: query i spells i in base len(CHARS), so no two requests share token ids.
CHARS = [w for w in QUERY_WORDS if len(w) == 1 and not w.isascii()]
FILLER = "在公园里"  # what fills a query out to `--query-tokens`
TEXT_REQUESTS = 20_000  # distinct queries per server and text path, more than the default query cache holds
STARTUP_S = 900.0  # a large model warms every bucket before /readyz answers


def distinct_query(i: int) -> str:
    """A short Chinese query (≤ 12 tokens for i < 10⁶) whose token ids no other `i` has."""
    digits, n = [], i + len(CHARS)  # at least two characters
    while n:
        n, digit = divmod(n, len(CHARS))
        digits.append(CHARS[digit])
    return "".join(digits) + "的照片"


def sized_query(i: int, tokens: int) -> str:
    """`distinct_query(i)`, filled out to exactly `tokens` tokens with [CLS] and [SEP] (one token per
    character; 0: as it is), so a server's cost per query can be compared at a length bucket's own."""
    query, room = distinct_query(i), tokens - 2
    if tokens and room < len(query):
        raise ValueError(f"query {i} takes {len(query) + 2} tokens, more than {tokens}")
    return (query + FILLER * room)[:room] if tokens else query


@dataclass
class Server:
    name: str
    host: str
    port: int
    text_lengths: list[int]  # the text models it serves by length; [context_length]: only cnclip_text
    query_tokens: int = 0  # the length of the queries the client sends it (0: the short distinct ones)


def served_buckets(args: argparse.Namespace) -> list[int]:
    """The batch buckets of worker and serve, as their runtime keeps them: `--buckets` (default: the
    settings' default) that the model has for `--precision` in both towers. Triton batches up to the largest."""
    towers = ModelManifest.load(args.model).towers
    if any(args.precision not in towers[t].graphs for t in ("text", "image")):
        raise SystemExit(f"{args.model} has no {args.precision} graphs for both towers")
    have = set(towers["text"].buckets(args.precision)) & set(towers["image"].buckets(args.precision))
    wanted = args.buckets or RuntimeSettings.model_fields["buckets"].get_default(call_default_factory=True)
    return [b for b in wanted if b in have]


def server_env(args: argparse.Namespace, data_dir: Path) -> dict[str, str]:
    """The settings `worker` and `serve` run with: this model, precision and buckets; the query cache as asked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
    env.update(
        CNCLIP_MODEL_DIR=str(args.model),
        CNCLIP_DATA_DIR=str(data_dir),
        CNCLIP_PROVIDER="cpu",
        CNCLIP_PRECISION=args.precision,
        CNCLIP_BUCKETS=json.dumps(served_buckets(args)),
        CNCLIP_QUERY_CACHE_SIZE=str(args.query_cache),
    )
    for setting in args.setting:
        name, _, value = setting.partition("=")
        if not name.startswith("CNCLIP_") or not _:
            raise SystemExit(f"--setting {setting!r}: expected CNCLIP_NAME=VALUE")
        env[name] = value
    return env


@contextmanager
def started(args: argparse.Namespace, workdir: Path) -> Iterator[list[Server]]:
    """Every server of `--servers`, up and ready; stopped on exit."""
    from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository

    manifest = ModelManifest.load(args.model)
    context = manifest.context_length
    servers = []
    with ExitStack() as stack:
        for name in args.servers:
            if name == "triton":
                repository = workdir / "triton-repository"
                options = ExportOptions(backend="python", max_batch=max(served_buckets(args)), precision=args.precision)
                export_triton_repository(args.model, repository, options, force=True)
                triton = RealTriton(repository, log_path=workdir / "triton.log").start(timeout_s=STARTUP_S)
                stack.callback(triton.close)
                host, triton_port = triton.url.split(":")
                lengths = [n for n in manifest.text_lengths(args.precision) if (repository / text_model(n)).is_dir()]
                servers.append(Server(name, host, int(triton_port), [*lengths, context], args.query_tokens))
                continue
            port = free_port()
            command = [name, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
            server = CliServer(command, server_env(args, workdir / f"{name}-data"), workdir / f"{name}.log")
            stack.callback(server.stop)
            server.start(startup_s=STARTUP_S)
            servers.append(Server(name, "127.0.0.1", port, [context], args.query_tokens))
        yield servers


def photos(count: int, width: int, height: int) -> list[bytes]:
    """Distinct photo-sized JPEGs (the seed's 1024×768 by default): decoding them is part of image-bytes."""
    rng = random.Random(5)
    return [random_jpeg(rng, (width, height)) for _ in range(count)]


def text_ids(server: Server, i: int) -> tuple[str, np.ndarray]:
    """(model, ids) for query `i` as a client of `server` sends it: cut to the shortest text model that holds it."""
    ((_, ids),) = split_by_length(tokenize([sized_query(i, server.query_tokens)]), server.text_lengths)
    return text_model(None if ids.shape[1] == server.text_lengths[-1] else ids.shape[1]), ids


def request_maker(
    server: Server, path: str, files: list[bytes], pixels: list[np.ndarray], texts: int = TEXT_REQUESTS
) -> RequestMaker:
    """The HTTP requests of `path` for `server`, built ahead (building them in the loop would take the
    client ~0.1 ms of the cores the server needs per request): `texts` distinct queries, the files, the pixels."""
    host, port = server.host, server.port

    def infer(model: str, body: bytes, headers: dict[str, str]) -> bytes:
        return http_request(host, port, f"/v2/models/{model}/infer", body, headers)

    if path == "text":

        def binary_text(i: int) -> bytes:
            model, ids = text_ids(server, i)
            return infer(model, *binary_body("text", "INT64", ids, "text_features"))

        return in_turn([binary_text(i) for i in range(texts)])
    if path == "text-json":

        def json_text(i: int) -> bytes:
            model, ids = text_ids(server, i)
            inputs = [{"name": "text", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}]
            body = json.dumps({"inputs": inputs, "outputs": [{"name": "text_features"}]}).encode()
            return infer(model, body, {"Content-Type": "application/json"})

        return in_turn([json_text(i) for i in range(texts)])
    if path == "image-bytes":  # [1, 1]: Triton's ensemble wants it; ours takes [n] and [n, 1]
        prebuilt = [
            infer(
                IMAGE_BYTES_MODEL, *binary_body("image_bytes", "BYTES", np.array([[f]], np.object_), "image_features")
            )
            for f in files
        ]
    else:
        prebuilt = [infer(IMAGE_MODEL, *binary_body("image", "FP32", p[None], "image_features")) for p in pixels]
    return in_turn(prebuilt)


def perf_analyzer_cell(
    tool: PerfAnalyzer,
    server: Server,
    path: str,
    files: list[bytes],
    pixels: list[np.ndarray],
    c: int,
    seconds: float,
    workdir: Path,
) -> tuple[float, float, float]:
    """One cell measured by perf_analyzer, sending the same kind of inputs as our client: 2,000 distinct
    queries (cycled: with the query cache on, perf_analyzer's repeats would be hits), the photos, the pixels."""
    data = workdir / f"input-{server.name}-{path}.json"
    extra: tuple[str, ...] = ()
    if path in ("text", "text-json"):
        model = text_ids(server, 0)[0]
        if not data.exists():
            write_input_data(data, "text", "INT64", [text_ids(server, i)[1][0] for i in range(2000)])
        if path == "text-json":
            extra = ("--input-tensor-format", "json", "--output-tensor-format", "json")
    elif path == "image-bytes":
        model = IMAGE_BYTES_MODEL
        if not data.exists():
            write_input_data(data, "image_bytes", "BYTES", files)
    else:
        model = IMAGE_MODEL
        if not data.exists():
            write_input_data(data, "image", "FP32", pixels[:8])
    result = run_cell(tool, f"{server.host}:{server.port}", model, c, seconds, data, data.with_suffix(".csv"), extra)
    return result.infer_per_s, result.p50_us, result.p99_us


def measure(args: argparse.Namespace, servers: list[Server], tool: PerfAnalyzer, workdir: Path) -> dict:
    """Every cell, `--rounds` times, interleaved; (server, path, concurrency) → [(infer/s, p50 µs, p99 µs)]."""
    files = photos(args.images, *args.photo)
    size = ModelManifest.load(args.model).image_size
    pixels = [preprocess_image(f, size) for f in files[:16]] if "image-tensor" in args.paths else []
    texts = max(TEXT_REQUESTS, 2 * args.query_cache + 1)
    makers = {(s.name, p): request_maker(s, p, files, pixels, texts) for s in servers for p in args.paths}
    runs: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    errors: list[str] = []
    for round_ in range(args.rounds):
        for c in args.concurrency:
            for path in args.paths:
                # Each round starts with another server: none is always measured right after a heavy one.
                for server in servers[round_ % len(servers) :] + servers[: round_ % len(servers)]:
                    if tool.runs:
                        result = perf_analyzer_cell(tool, server, path, files, pixels, c, args.duration, workdir)
                    else:
                        cell = asyncio.run(
                            closed_loop(
                                server.host, server.port, makers[(server.name, path)], c, args.duration, args.warmup
                            )
                        )
                        errors += [f"{server.name} {path} c{c}: {e}" for e in cell.errors[:5]]
                        result = (cell.infer_per_s, cell.percentile_us(50), cell.percentile_us(99))
                    runs.setdefault((server.name, path, c), []).append(result)
                    print(
                        f"round {round_ + 1} c{c} {server.name} {path}: {result[0]:.1f}/s", file=sys.stderr, flush=True
                    )
    return {"runs": runs, "errors": errors}


def cache_state(args: argparse.Namespace, servers: list[Server]) -> str:
    """Whether the query cache was on, from the setting and from our servers' /metrics after the run."""
    said = []
    for server in servers:
        if server.name == "triton":
            continue
        text = httpx.get(f"http://{server.host}:{server.port}/metrics", timeout=10).text
        found = dict(re.findall(r'^cnclip_query_cache_(hits_total|entries)\{tower="text"\} ([0-9.e+]+)$', text, re.M))
        said.append(
            f"{server.name} {float(found.get('hits_total', 0)):.0f} hits, {float(found.get('entries', 0)):.0f} entries"
        )
    state = (
        f"on (CNCLIP_QUERY_CACHE_SIZE={args.query_cache})" if args.query_cache else "off (CNCLIP_QUERY_CACHE_SIZE=0)"
    )
    return f"query cache {state}; after the run: {'; '.join(said) or 'no server of ours'} (Triton has none)"


def table(runs: dict[tuple[str, str, int], list[tuple[float, float, float]]]) -> list[str]:
    lines = [
        "| config | concurrency | infer/sec | min–max | p50 usec | p99 usec | × triton |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (server, path, c), cells in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        rate = statistics.median(r[0] for r in cells)
        triton = runs.get(("triton", path, c))
        ratio = f"{rate / statistics.median(r[0] for r in triton):.2f}" if triton and server != "triton" else ""
        lines.append(
            f"| {server} {path} | {c} | {rate:.1f} | {min(r[0] for r in cells):.1f}–{max(r[0] for r in cells):.1f} "
            f"| {statistics.median(r[1] for r in cells):.0f} | {statistics.median(r[2] for r in cells):.0f} | {ratio} |"
        )
    return lines


def verdicts(runs: dict[tuple[str, str, int], list[tuple[float, float, float]]]) -> list[str]:
    """The issue's two asks, checked on the medians: throughput never falls as concurrency rises (5 %
    slack for noise), and our servers give at least Triton's at every concurrency."""
    rate = {key: statistics.median(r[0] for r in cells) for key, cells in runs.items()}
    falls, below = [], []
    for server, path in sorted({(s, p) for s, p, _ in rate}):
        levels = sorted(c for s, p, c in rate if (s, p) == (server, path))
        for low, high in zip(levels, levels[1:], strict=False):
            if rate[(server, path, high)] < 0.95 * rate[(server, path, low)]:
                falls.append(f"{server} {path} c{low}→c{high}")
        if server != "triton":
            below += [
                f"{server} {path} c{c}" for c in levels if rate[(server, path, c)] < rate.get(("triton", path, c), 0)
            ]
    return [
        f"throughput falls as concurrency rises: {', '.join(falls) or 'nowhere'}",
        f"below Triton: {', '.join(below) or 'nowhere'}",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_DIR, help="a converted model directory")
    parser.add_argument("--precision", default="fp32", help="the graphs every server runs (fp32, int8, ...)")
    parser.add_argument(
        "--buckets",
        type=ints,
        help="batch buckets (default: CNCLIP_BUCKETS' default); Triton's max batch is the largest",
    )
    parser.add_argument("--servers", type=lambda v: v.split(","), default=list(SERVERS), help=",".join(SERVERS))
    parser.add_argument("--paths", type=lambda v: v.split(","), default=list(PATHS[:3]), help=",".join(PATHS))
    parser.add_argument("--concurrency", type=ints, default=[1, 2, 4, 8])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each cell")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats; the table gives medians")
    parser.add_argument("--images", type=int, default=64, help="distinct photos the image paths cycle through")
    parser.add_argument("--photo", type=lambda v: tuple(ints(v.replace("x", ","))), default=(1024, 768), help="WxH")
    parser.add_argument("--query-tokens", type=int, default=0, help="queries of exactly N tokens (0: 7-8 tokens)")
    parser.add_argument("--query-cache", type=int, default=0, help="CNCLIP_QUERY_CACHE_SIZE of worker/serve (0: off)")
    parser.add_argument("--own-client", action="store_true", help="the project's client even where perf_analyzer runs")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="CNCLIP_NAME=VALUE",
        help="a setting for worker and serve (repeatable), e.g. CNCLIP_STREAMS=2",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR / "bench_concurrency.json")
    args = parser.parse_args(argv)
    for name, values, allowed in (("--servers", args.servers, SERVERS), ("--paths", args.paths, PATHS)):
        if not set(values) <= set(allowed):
            parser.error(f"{name}: one or more of {', '.join(allowed)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tool = find_perf_analyzer()
    if args.own_client and tool.runs:
        tool = PerfAnalyzer(tool.path, False, f"{tool.note} — not used (--own-client)")
    load_tool = "perf_analyzer" if tool.runs else "the project's closed-loop client (retrieval/toolchain/http_load.py)"
    started_at, before = dt.datetime.now(dt.UTC), machine()
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as scratch, started(args, Path(scratch)) as servers:
        result = measure(args, servers, tool, Path(scratch))
        cache = cache_state(args, servers)
    lines = [
        f"{started_at:%Y-%m-%d %H:%M} UTC; {before}; at the end load {os.getloadavg()[0]:.2f}",
        f"model {args.model}, {args.precision}, buckets {served_buckets(args)}; {args.rounds} round(s) × {args.duration:g} s "
        f"per cell after {args.warmup:g} s warm-up; photos {args.photo[0]}×{args.photo[1]}; text queries "
        + (f"{args.query_tokens} tokens" if args.query_tokens else "7-8 tokens")
        + (f"; worker/serve settings {' '.join(args.setting)}" if args.setting else ""),
        f"load: {load_tool}; {tool.note}",
        cache,
        *table(result["runs"]),
        *verdicts(result["runs"]),
    ]
    print("\n".join(lines))
    for error in result["errors"]:
        print("ERROR", error)
    OUT_DIR.mkdir(exist_ok=True)
    runs = {f"{s} {p} c{c}": cells for (s, p, c), cells in result["runs"].items()}
    args.out.write_text(json.dumps({"header": lines[:4], "runs": runs, "errors": result["errors"]}, indent=1))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
