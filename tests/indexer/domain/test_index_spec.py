"""Index descriptions are parsed against a grammar, never tried (issue 21 #3): every supported form
parses to its one spelling and builds in FAISS at its bounds; a corpus of malformed descriptions
(three of which used to kill the process inside FAISS) is refused with the typed error by the
parser, the catalog, the Milvus plan, `cnclip index --index` and a real `cnclip serve` process,
which answers each with a 422 and stays alive."""

from __future__ import annotations

from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.domain.index_spec import (
    ALLOWED_FORMS,
    FLAT,
    MAX_LISTS,
    IndexSpec,
    InvalidIndexDescription,
    parse_index,
)
from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss.index import IndexFileError, VectorIndex
from indexer.storage.vectors.milvus.plan import LITE, IndexPlan, plan_index, server_capabilities
from tests.support.cli_server import running_server
from tests.support.indexer_helpers import cli_env, open_test_catalog, random_unit, write_images

DIM = 32
SERVER = server_capabilities("v2.3.5")  # the Milvus server the suite runs

SUPPORTED = [
    ("Flat", FLAT, "Flat"),
    ("HNSW", IndexSpec("hnsw", links=32), "HNSW32"),  # FAISS's and Milvus's bare HNSW
    ("HNSW2", IndexSpec("hnsw", links=2), "HNSW2"),
    ("HNSW32,Flat", IndexSpec("hnsw", links=32), "HNSW32"),
    ("HNSW512", IndexSpec("hnsw", links=512), "HNSW512"),
    ("IVF1,Flat", IndexSpec("ivf_flat", lists=1), "IVF1,Flat"),
    ("IVF65536,Flat", IndexSpec("ivf_flat", lists=65536), "IVF65536,Flat"),
    ("IVF8,PQ4", IndexSpec("ivf_pq", lists=8, parts=4, bits=8), "IVF8,PQ4"),
    ("IVF8,PQ4x8", IndexSpec("ivf_pq", lists=8, parts=4, bits=8), "IVF8,PQ4"),
    ("IVF8,PQ32x1", IndexSpec("ivf_pq", lists=8, parts=32, bits=1), "IVF8,PQ32x1"),
    ("IVF1,PQ1x4", IndexSpec("ivf_pq", lists=1, parts=1, bits=4), "IVF1,PQ1x4"),
]

# The three that killed the process (SIGFPE / SIGSEGV inside FAISS), then every other way to be wrong.
CRASHED_FAISS = ["PQ8x0", "IVF8,RQ1x0", "RR0,Flat"]
MALFORMED = [
    *CRASHED_FAISS,
    # zero, negative, huge, out of bounds
    "IVF0,Flat", "IVF0", "HNSW0", "HNSW1", "HNSW513", "HNSW-1", "IVF-8,Flat", "IVF65537,Flat",
    "IVF99999999,Flat", "IVF" + "9" * 50 + ",Flat", "IVF8,PQ0", "IVF8,PQ4x0", "IVF8,PQ4x9", "IVF8,PQ4x16",
    "IVF8,PQ5", "IVF8,PQ64", "IVF8,PQ33", "IVF8,PQ4x-8",
    # digits of other scripts, full-width letters, signs and separators that int() would take
    "IVF١٠,Flat", "HNSW٣٢", "IVF８,Flat", "ＨＮＳＷ32", "IVF1_024,Flat", "IVF+8,Flat", "IVF8.0,Flat", "IVF0x10,Flat",
    "IVF1e3,Flat", "IVF08,Flat", "HNSW032",
    # whitespace and case
    " Flat", "Flat ", "Flat\n", "\tHNSW32", "IVF8, Flat", "IVF 8,Flat", "IVF8,Flat\x00", "flat", "FLAT", "hnsw32",
    "ivf8,flat",
    # empty, long, nested, repeated
    "", ",", ",,", "Flat,", ",Flat", "Flat,Flat", "IVF8,Flat,Flat", "IVF8,,Flat", "IVF8,IVF8,Flat", "HNSW32,PQ4",
    "HNSW32,IVF8,Flat", "IVF8_HNSW32,Flat", "IVF8(IVF4),Flat", "Flat" * 17, "IVF8," + "Flat," * 40 + "Flat",
    "x" * 10_000, "HNSW" + "3" * 100,
    # every FAISS factory token we do not build
    "PQ8", "PQ8x8", "PQ8np", "SQ8", "SQfp16", "IVF8,SQ8", "IVF8,SQ4", "IVF8,SQfp16", "IVF8,PQ4fs", "IVF8,PQ4x4fs",
    "IVF8,PQ4+8", "IVF8,PQ4np", "IVF8,RQ4", "IVF8,LSQ4", "RQ4x8", "LSQ4x8", "PRQ2x4x8", "ProductLSQ2x4x8", "LSH",
    "LSHrt", "OPQ4,IVF8,PQ4", "OPQ4_32,IVF8,PQ4", "PCA16,Flat", "PCAR16,IVF8,Flat", "ITQ16,LSH", "RR32,Flat",
    "L2norm,Flat", "IDMap,Flat", "IDMap2,Flat", "IDMap,HNSW32", "IVF8_HNSW32,Flat", "IMI2x4,Flat", "IVF8,Flat,RFlat",
    "IVF8,PQ4,Refine(Flat)", "HNSW32_PQ4", "HNSW32,SQ8", "NSG32", "NSG32,Flat", "IVF8(PQ4),Flat", "RaBitQ", "IVF8,RaBitQ",
    "BinaryFlat", "Residual4x8,PQ4", "IVF8,Flat;Flat", "Flat\u200b", "Fla\u0074\u0301",
]  # fmt: skip


@pytest.mark.parametrize(("text", "spec", "spelling"), SUPPORTED, ids=[s[0] for s in SUPPORTED])
def test_every_supported_form_parses_to_its_one_spelling(text: str, spec: IndexSpec, spelling: str) -> None:
    parsed = parse_index(text, DIM)
    assert parsed == spec and parsed.description == spelling
    assert parse_index(spelling, DIM) == spec  # the spelling parses back to the same record
    assert parsed.exact_scores == (spec.kind != "ivf_pq") and parsed.needs_training == (spec.kind != "flat")


def test_the_malformed_corpus_is_refused_with_the_typed_error_only() -> None:
    assert len(set(MALFORMED)) >= 100
    for text in MALFORMED:
        with pytest.raises(InvalidIndexDescription) as refused:  # any other exception fails the test
            parse_index(text, DIM)
        message = refused.value.message
        assert message.isprintable() and len(message) < 400, text  # quoted, escaped, bounded
        if "needs" not in message:  # outside the grammar (not a bound): the message lists what is allowed
            assert ALLOWED_FORMS in message, text
    with pytest.raises(InvalidIndexDescription, match="HNSW needs 2 to 512 links per node, not 0"):
        parse_index("HNSW0")
    with pytest.raises(InvalidIndexDescription, match="divides the dimension 32"):
        parse_index("IVF8,PQ5", DIM)
    assert parse_index("IVF8,PQ5") == IndexSpec("ivf_pq", lists=8, parts=5, bits=8)  # dimension not known yet
    for not_text in (None, 8, b"Flat", ["Flat"]):
        with pytest.raises(InvalidIndexDescription):
            parse_index(not_text, DIM)


def test_every_bound_the_grammar_accepts_builds_trains_and_searches_in_faiss() -> None:
    """The bounds are safe: FAISS builds each extreme the grammar lets through (a crash here kills
    the test run, which is the point), and the cheap ones train and find a vector through the
    project's own build (its sample and FAISS options)."""
    vectors = random_unit(320, DIM)  # 256 points for an 8-bit PQ codebook; the build wants 39 per IVF list
    ids = np.arange(len(vectors), dtype=np.int64)
    for text, spec, _ in SUPPORTED:
        faiss.index_factory(DIM, spec.description, faiss.METRIC_INNER_PRODUCT)
        if spec.lists > 8 or (spec.kind == "ivf_pq" and spec.bits * spec.parts > 64):
            continue  # built; training 65536 lists or 32 codebooks of 256 would take minutes
        index = VectorIndex(DIM, text, "m", SearchTuning(train_min=1, nprobe=8))
        trained = index.build(ids, lambda wanted: vectors[wanted])
        assert trained.active_spec == spec and trained.ntotal == len(ids), text
        found, _scores = trained.search(vectors[7], 1, lambda wanted: vectors[wanted])
        assert found[0] >= 0, text


def test_faiss_only_sees_the_rerendered_description(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = faiss.index_factory

    def recording(dim: int, description: str, metric: int) -> faiss.Index:
        seen.append(description)
        return real(dim, description, metric)

    monkeypatch.setattr(faiss, "index_factory", recording)
    tuning = SearchTuning(train_min=1, nprobe=4)
    ids = np.arange(300, dtype=np.int64)
    vectors = random_unit(300, DIM)
    index = VectorIndex(DIM, "HNSW8,Flat", "m", tuning)
    trained = index.build(ids, lambda wanted: vectors[wanted])
    assert seen == ["HNSW8"] and trained.active == "HNSW8,Flat"
    # A stored description an older version accepted by trying it is searched exactly, never handed to FAISS.
    for legacy in CRASHED_FAISS + ["OPQ4,IVF8,PQ4", "IVF8,SQ8"]:
        index = VectorIndex(DIM, legacy, "m", tuning)
        rebuilt = index.build(ids, lambda wanted: vectors[wanted])
        assert rebuilt.active == "Flat" and not index.wants_training(10**6)
        found, scores = rebuilt.search(vectors[7], 3, lambda wanted: vectors[wanted])
        assert found[0] == 7 and abs(scores[0] - 1) < 1e-5
    assert seen == ["HNSW8"]


def test_the_catalog_stores_one_spelling_and_refuses_the_corpus(tmp_path: Path) -> None:
    catalog = open_test_catalog(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        assert catalog.create_collection("a", "images", "fake", DIM, "HNSW").index == "HNSW32"
        assert catalog.create_collection("b", "images", "fake", DIM, "IVF8,PQ4x8").index == "IVF8,PQ4"
        for text in MALFORMED:
            with pytest.raises(InvalidIndexDescription):
                catalog.create_collection("c", "images", "fake", DIM, text)
        assert [c.name for c in catalog.list_collections()] == ["a", "b"]
    finally:
        catalog.close()


def test_the_milvus_plan_consumes_the_parsed_record() -> None:
    assert plan_index("Flat", DIM, SERVER) == IndexPlan("FLAT")
    assert plan_index("HNSW", DIM, SERVER) == IndexPlan("HNSW", {"M": 32, "efConstruction": 128})
    assert plan_index("IVF16,Flat", DIM, SERVER) == IndexPlan("IVF_FLAT", {"nlist": 16})
    assert plan_index("IVF16,PQ8x4", DIM, SERVER) == IndexPlan("IVF_PQ", {"nlist": 16, "m": 8, "nbits": 4})
    assert plan_index("IVF16,PQ8", DIM, LITE) == IndexPlan("IVF_SQ8", {"nlist": 16})
    assert plan_index(f"IVF{MAX_LISTS},Flat", DIM, LITE).params == {"nlist": MAX_LISTS}
    for text in MALFORMED:
        with pytest.raises(InvalidIndexDescription):
            plan_index(text, DIM, SERVER)


def test_cnclip_index_refuses_a_bad_index_before_anything_opens(tmp_path: Path, toy_model_dir: Path) -> None:
    data_dir = tmp_path / "data"
    env = cli_env(data_dir, f"sqlite:///{data_dir / 'catalog.db'}", toy_model_dir)
    folder = tmp_path / "photos"
    write_images(folder, 2)
    for text in [*CRASHED_FAISS, "IVF١٠,Flat", "HNSW0", " Flat"]:
        result = CliRunner().invoke(build_cli(), ["index", str(folder), "-c", "photos", "--index", text], env=env)
        assert result.exit_code == 1, (text, result.output)
        assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert not data_dir.exists()  # neither the catalog nor the model was opened
    result = CliRunner().invoke(build_cli(), ["index", str(folder), "-c", "photos", "--index", "HNSW"], env=env)
    assert result.exit_code == 0, result.output
    stats = CliRunner().invoke(build_cli(), ["stats"], env=env)
    assert "HNSW32" in stats.output, stats.output


def test_a_server_process_answers_the_corpus_with_422_and_stays_alive(tmp_path: Path, toy_model_dir: Path) -> None:
    data_dir = tmp_path / "data"
    env = cli_env(data_dir, f"sqlite:///{data_dir / 'catalog.db'}", toy_model_dir)
    with running_server(env) as base, httpx.Client(base_url=base, timeout=10) as client:
        for text in MALFORMED:
            answer = client.post("/v1/collections", json={"name": "c", "kind": "images", "index": text})
            assert answer.status_code == 422, (text, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input", text
            assert client.get("/healthz").status_code == 200, text  # the process is alive and answering
        made = client.post("/v1/collections", json={"name": "c", "kind": "images", "index": "IVF64,PQ4x4"})
        assert made.status_code == 201 and made.json()["index"] == "IVF64,PQ4x4", made.text


def test_a_file_trained_from_a_description_outside_the_grammar_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    legacy = VectorIndex(DIM, "IVF8,SQ8", "m")
    legacy.add(np.arange(5, dtype=np.int64), random_unit(5, DIM))
    legacy.active = "IVF8,SQ8"  # as an older version, which built it by trying, saved it
    legacy.save(tmp_path / "c.faiss")
    with pytest.raises(IndexFileError, match="does not build"):
        VectorIndex.load(tmp_path / "c.faiss", DIM, "IVF8,SQ8", "m")
    legacy.active = "Flat"  # never trained: its Flat file is used as it is
    legacy.save(tmp_path / "c.faiss")
    assert VectorIndex.load(tmp_path / "c.faiss", DIM, "IVF8,SQ8", "m").ntotal == 5
