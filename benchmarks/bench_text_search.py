"""Text-search latency (issue 32): indexer/storage/sql/text_search.py `find_texts` at 100k items with
recognised text, on SQLite and PostgreSQL, by query length.

    python benchmarks/bench_text_search.py --size 100000                  # the published run (both databases)
    python benchmarks/bench_text_search.py --size 2000 --queries 20       # a smoke run (seconds)
    python benchmarks/bench_text_search.py --databases sqlite             # one database

The catalog schema is the migrations' (`upgrade`); items are inserted as bare rows and their texts
through the SQL writes the OCR stage uses (indexer/storage/sql/text_rows.py: the text row and its
1-3-character grams in one transaction). Texts are 4 to 40 characters drawn Zipf-like from 3,000 CJK
characters, one in five with Latin letters and digits mixed in (a ticket, an opening time), so common
characters hit a large share of the collection as on real photos. Queries are substrings of stored
texts (1, 2, 3, 4 and 8 characters: 1-3 are one gram lookup, longer ones a trigram intersection and a
substring check) and absent 4-character runs; each is timed cold once and then `--repeat` times
(warm), answering up to 1,000 matches as the hybrid search asks. Prints a markdown table of p50/p95
(ms) per database and query length, with the median number of matches, and the fill time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, insert  # noqa: E402

from indexer.domain.item_texts import RecognisedText, TextLine  # noqa: E402
from indexer.domain.text_grams import normalize_text  # noqa: E402
from indexer.storage.sql.db import create_db_engine, upgrade  # noqa: E402
from indexer.storage.sql.models import CollectionRow, ItemRow  # noqa: E402
from indexer.storage.sql.text_rows import TextRows  # noqa: E402
from indexer.storage.sql.text_search import find_texts  # noqa: E402

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
LENGTHS = (1, 2, 3, 4, 8)
LIMIT = 1000  # the hybrid search's depth (indexer/domain/paging.py MAX_CANDIDATES)
CHUNK = 2000
BOX = ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0))


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores ({cpu}), load average {os.getloadavg()[0]:.2f}"


def make_texts(size: int, seed: int) -> list[str]:
    """`size` texts (see the module docstring)."""
    rng = random.Random(seed)
    alphabet = [chr(0x4E00 + i * 7) for i in range(3000)]  # spread over the CJK block
    weights = [1.0 / (rank + 1) for rank in range(len(alphabet))]  # Zipf: a few characters are everywhere
    texts = []
    for _ in range(size):
        chars = rng.choices(alphabet, weights, k=rng.randint(4, 40))
        if rng.random() < 0.2:
            chars.insert(rng.randrange(len(chars)), f" G{rng.randint(1, 9999)} {rng.randint(0, 23)}:00")
        texts.append("".join(chars))
    return texts


def fill(engine: Engine, texts: list[str]) -> tuple[int, float]:
    """A collection with one item per text, each text stored with its grams; (collection id, seconds)."""
    started = time.perf_counter()
    with engine.begin() as connection:
        collection_id = connection.execute(
            insert(CollectionRow)
            .values(name="bench", name_key="bench", kind="images", model="m", dim=8, vector_key="k", ocr=True)
            .returning(CollectionRow.id)
        ).scalar_one()
    rows = TextRows(engine)
    for start in range(0, len(texts), CHUNK):
        part = texts[start : start + CHUNK]
        with engine.begin() as connection:
            ids = (
                connection.execute(
                    insert(ItemRow).returning(ItemRow.id),
                    [
                        {"collection_id": collection_id, "sha256": f"{start + i:064x}", "tags": [], "extra": {}}
                        for i in range(len(part))
                    ],
                )
                .scalars()
                .all()
            )
        rows.put(
            collection_id,
            {int(i): RecognisedText((TextLine(t, BOX, 0.9),), "bench") for i, t in zip(ids, part, strict=True)},
        )
    return collection_id, time.perf_counter() - started


def queries(texts: list[str], per_length: int, seed: int) -> dict[str, list[str]]:
    """Substrings of stored texts by length, and absent runs (normal form)."""
    rng = random.Random(seed + 1)
    found: dict[str, list[str]] = {}
    for length in LENGTHS:
        pieces = []
        while len(pieces) < per_length:
            text = normalize_text(rng.choice(texts))
            if len(text) >= length:
                start = rng.randrange(len(text) - length + 1)
                pieces.append(text[start : start + length])
        found[str(length)] = pieces
    found["absent 4"] = ["".join(rng.choice("的一是不") for _ in range(3)) + "\u9fa5" for _ in range(per_length)]
    return found


def measure(engine: Engine, collection_id: int, asked: dict[str, list[str]], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, pieces in asked.items():
        times, hits = [], []
        for piece in pieces:
            find_texts(engine, collection_id, [piece], None, LIMIT)  # cold
            for _ in range(repeat):
                started = time.perf_counter()
                answer = find_texts(engine, collection_id, [piece], None, LIMIT)
                times.append((time.perf_counter() - started) * 1000.0)
            hits.append(len(answer.matches))
        times.sort()
        out[label] = {
            "p50_ms": round(statistics.median(times), 2),
            "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 2),
            "median_matches": statistics.median(hits),
        }
    return out


def run_database(name: str, args: argparse.Namespace, texts: list[str], asked: dict[str, list[str]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        if name == "sqlite":
            url = f"sqlite:///{Path(scratch) / 'catalog.db'}"
            schema = None
        else:
            schema = f"bench_text_{os.getpid()}"
            admin = create_db_engine(args.postgres_url)
            with admin.begin() as connection:
                connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            url = f"{args.postgres_url}?options=-csearch_path%3D{schema}"
        engine = create_db_engine(url)
        try:
            upgrade(engine)
            collection_id, seconds = fill(engine, texts)
            if name == "postgresql":
                with engine.begin() as connection:
                    connection.exec_driver_sql("ANALYZE")
            return {"fill_s": round(seconds, 1), "lengths": measure(engine, collection_id, asked, args.repeat)}
        finally:
            engine.dispose()
            if schema is not None:
                with admin.begin() as connection:
                    connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="items with text")
    parser.add_argument("--queries", type=int, default=50, help="queries per length")
    parser.add_argument("--repeat", type=int, default=3, help="warm timings per query")
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    texts = make_texts(args.size, args.seed)
    asked = queries(texts, args.queries, args.seed)
    results = {name: run_database(name, args, texts, asked) for name in args.databases}
    if args.json:
        print(json.dumps({"machine": machine(), "size": args.size, "results": results}, ensure_ascii=False))
        return
    print(f"text search, {args.size} items with text; {machine()}")
    print("| database | query | p50 ms | p95 ms | median matches |")
    print("| --- | --- | --- | --- | --- |")
    for name, result in results.items():
        for label, row in result["lengths"].items():
            chars = label if label.startswith("absent") else f"{label} chars"
            print(f"| {name} | {chars} | {row['p50_ms']} | {row['p95_ms']} | {row['median_matches']} |")
    for name, result in results.items():
        print(f"{name}: filled in {result['fill_s']} s")


if __name__ == "__main__":
    main()
