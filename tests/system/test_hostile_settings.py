"""Settings, tuning files and model directories as an attacker writes them (issue 28, item 3): every
hostile value stops `cnclip serve` / `cnclip migrate --model` with ONE line on stderr and status 2 —
never a traceback, never a hang (each run has a timeout), never more threads than the machine has.

The table is by class, one row per way in: a FIFO or a device where a file is named, JSON nested
50,000 deep or with a key twice, numbers out of range, a manifest that lies about its graphs, a graph
that is no file, more threads or streams than cores, a budget nothing fits in, a watched collection
its watcher refuses. A running server and encoder against hostile values (the thread bound, a failed
migration, a non-ASCII API key, a FIFO tuning file at start-up): tests/system/test_hostile_runtime.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retrieval.errors import ModelError
from retrieval.manifest import MANIFEST_NAME, ModelManifest
from retrieval.regular_file import UnusableFile, read_regular
from retrieval.tuning import TUNING_NAME, read_tuning
from tests.support.hostile_models import CORES, RUN_TIMEOUT_S, base_env, spoiled, toy_model
from tests.support.indexer_helpers import run_cnclip

DEEP = "[" * 50_000


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_model(tmp_path_factory)


def manifest_edit(**fields: Any) -> Callable[[Path], None]:
    """Set top-level manifest fields (None: delete); `towers.image=…` style keys reach one level down."""

    def change(model: Path) -> None:
        raw = json.loads((model / MANIFEST_NAME).read_text())
        for key, value in fields.items():
            head, _, tail = key.partition("__")
            target = raw[head] if tail else raw
            target[tail or head] = value
        (model / MANIFEST_NAME).write_text(json.dumps(raw))

    return change


def manifest_text(text: str) -> Callable[[Path], None]:
    return lambda model: (model / MANIFEST_NAME).write_text(text)


def graph_replaced(how: str) -> Callable[[Path], None]:
    """The first image graph swapped for a FIFO, a link to /dev/zero, or an 8 GiB sparse file."""

    def change(model: Path) -> None:
        graph = model / "image.fp32.b1.onnx"
        graph.unlink()
        if how == "fifo":
            os.mkfifo(graph)
        elif how == "zero":
            graph.symlink_to("/dev/zero")
        else:
            with graph.open("wb") as f:
                f.truncate(8 << 30)

    return change


def linked_to(name: str, target: str) -> Callable[[Path], None]:
    """The model's file `name` swapped for a symbolic link to `target`."""

    def change(model: Path) -> None:
        (model / name).unlink()
        (model / name).symlink_to(target)

    return change


def fifo_at(path: Path) -> Path:
    os.mkfifo(path)
    return path


# (case, env builder (tmp, toy model) -> extra env, words the one line must hold)
SERVE_CASES: list[tuple[str, Callable[[Path, Path], dict[str, str]], str]] = [
    ("tuning file a FIFO", lambda t, m: {"CNCLIP_TUNING_FILE": str(fifo_at(t / "fifo"))}, "is a FIFO"),
    ("tuning file /dev/zero", lambda t, m: {"CNCLIP_TUNING_FILE": "/dev/zero"}, "is a character device"),
    ("tuning file a directory", lambda t, m: {"CNCLIP_TUNING_FILE": str(t)}, "is a directory"),
    ("watch nested 50,000 deep", lambda t, m: {"CNCLIP_WATCH": DEEP}, "nested too deeply"),
    ("watch with a key twice", lambda t, m: {"CNCLIP_WATCH": f'{{"{t}": "a", "{t}": "b"}}'}, "appears twice"),
    ("model dirs nested 50,000 deep", lambda t, m: {"CNCLIP_MODEL_DIRS": DEEP}, "nested too deeply"),
    ("buckets nested 50,000 deep", lambda t, m: {"CNCLIP_BUCKETS": DEEP}, "nested too deeply"),
    ("text lengths with 100,000 digits", lambda t, m: {"CNCLIP_TEXT_LENGTHS": "[" + "9" * 100_000 + "]"}, "JSON"),
    ("streams beyond the cores", lambda t, m: {"CNCLIP_STREAMS": str(CORES + 1)}, "cores"),
    ("4096 threads per stream", lambda t, m: {"CNCLIP_THREADS_PER_STREAM": "4096"}, "cores"),
    (
        "streams × threads beyond the cores",
        lambda t, m: {"CNCLIP_STREAMS": "1", "CNCLIP_THREADS_PER_STREAM": str(CORES + 1)},
        "cores",
    ),  # fmt: skip
    ("100,000 read threads", lambda t, m: {"CNCLIP_INDEX_READ_THREADS": "100000"}, "per core"),
    ("memory budget 1 MB", lambda t, m: {"CNCLIP_MEMORY_BUDGET_MB": "1"}, "CNCLIP_MEMORY_BUDGET_MB=1"),
    ("API key not UTF-8", lambda t, m: {"CNCLIP_API_KEY": "ab\udcffc"}, "is not UTF-8 text"),
    ("API key with a newline", lambda t, m: {"CNCLIP_API_KEY": "ab\ncd"}, "control characters"),
    ("a timeout of inf", lambda t, m: {"CNCLIP_HEADER_READ_TIMEOUT_S": "inf"}, "finite number"),
    ("a queue delay of nan", lambda t, m: {"CNCLIP_MAX_QUEUE_DELAY_MS": "nan"}, "finite number"),
    (
        "storage: the SQLite file a FIFO",
        lambda t, m: {"CNCLIP_DATABASE_URL": f"sqlite:///{fifo_at(t / 'c.db')}"},
        "is a FIFO",
    ),  # fmt: skip
    (
        "storage: the Milvus Lite file a FIFO",
        lambda t, m: {"CNCLIP_VECTOR_STORE": "milvus", "CNCLIP_MILVUS_URI": str(fifo_at(t / "m.db"))},
        "is a FIFO",
    ),  # fmt: skip
    ("data dir /dev/null", lambda t, m: {"CNCLIP_DATA_DIR": "/dev/null"}, "is not a folder"),
    ("database URL not a URL", lambda t, m: {"CNCLIP_DATABASE_URL": "garbage"}, "not a database URL"),
    ("port out of range", lambda t, m: {"CNCLIP_PORT": "99999"}, "CNCLIP_PORT"),
    ("model dir a FIFO", lambda t, m: {"CNCLIP_MODEL_DIR": str(fifo_at(t / "fifo"))}, "Not a directory"),
    (
        "model dirs naming a FIFO manifest",
        lambda t, m: _model_dirs(spoiled(m, t, lambda d: (d / MANIFEST_NAME).unlink() or os.mkfifo(d / MANIFEST_NAME))),
        "FIFO",
    ),  # fmt: skip
    # The hidden set's kind: every way a folder's name can fail is one line, not an OSError from mkdir.
    ("data dir a name too long", lambda t, m: {"CNCLIP_DATA_DIR": str(t / ("9" * 300))}, "(File name too long)"),
    (
        "data dir a link to nothing",
        lambda t, m: {"CNCLIP_DATA_DIR": str(_link(t / "d", t / "gone"))},
        "link to nothing",
    ),
    (
        "data dir inside a link to nothing",
        lambda t, m: {"CNCLIP_DATA_DIR": str(_link(t / "d", t / "gone") / "sub")},
        "cannot be made",
    ),  # fmt: skip
    ("data dir a loop of links", lambda t, m: {"CNCLIP_DATA_DIR": str(_loop(t))}, "symbolic links"),
    ("data dir under a file", lambda t, m: {"CNCLIP_DATA_DIR": str(_file(t / "f") / "sub")}, "(Not a directory)"),
    ("data dir not UTF-8", lambda t, m: {"CNCLIP_DATA_DIR": str(t) + "/\udcff"}, "is not UTF-8 text"),
    # One line per setting, however many errors pydantic finds in it (one per item, one per union branch).
    ("10,000 bad buckets", lambda t, m: {"CNCLIP_BUCKETS": json.dumps(["a"] * 10_000)}, "(and 9,998 more)"),
    ("memory budget -1 (a union)", lambda t, m: {"CNCLIP_MEMORY_BUDGET_MB": "-1"}, "'auto'; or "),
    # Numbers that reach FAISS's C++ ints are bounded where they enter (an OverflowError degraded HNSW).
    ("ef_search 10^20", lambda t, m: {"CNCLIP_INDEX_EF_SEARCH": "9" * 20}, "CNCLIP_INDEX_EF_SEARCH"),
    ("nprobe 10^20", lambda t, m: {"CNCLIP_INDEX_NPROBE": "9" * 20}, "CNCLIP_INDEX_NPROBE"),
    ("rerank factor 10^20", lambda t, m: {"CNCLIP_SEARCH_RERANK_FACTOR": "9" * 20}, "CNCLIP_SEARCH_RERANK_FACTOR"),
    # URLs: parsed with the settings by the one parser their user has, never a ValueError at start-up.
    ("encoder port out of range", lambda t, m: {"CNCLIP_ENCODER": "triton://h:99999"}, "Port out of range"),
    ("encoder IPv6 unclosed", lambda t, m: {"CNCLIP_ENCODER": "triton://[::1"}, "Invalid IPv6 URL"),
    ("encoder host not UTF-8", lambda t, m: {"CNCLIP_ENCODER": "triton://\udcff:8000"}, "printable ASCII"),
    ("database URL of a driver not installed", lambda t, m: {"CNCLIP_DATABASE_URL": "mysql://x/y"}, "not a supported"),
    ("database URL not UTF-8", lambda t, m: {"CNCLIP_DATABASE_URL": "postgresql://\udcff@h/db"}, "is not UTF-8 text"),
    (
        "storage: the SQLite file a link to /proc/self/mem",
        lambda t, m: {"CNCLIP_DATABASE_URL": f"sqlite:///{_link(t / 'c.db', Path('/proc/self/mem'))}"},
        "cannot be read (Input/output error)",
    ),  # fmt: skip
    (
        "storage: the SQLite file in /proc",
        lambda t, m: {"CNCLIP_DATABASE_URL": "sqlite:////proc/self/c.db"},
        "cannot be used",
    ),
    (
        "storage: the SQLite file a name too long",
        lambda t, m: {"CNCLIP_DATABASE_URL": f"sqlite:///{t / ('9' * 300)}"},
        "(File name too long)",
    ),  # fmt: skip
]


def _link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _loop(tmp: Path) -> Path:
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")
    return tmp / "loop-a"


def _file(path: Path) -> Path:
    path.write_text("x")
    return path


# Model directories, each named by CNCLIP_MODEL_DIRS to `cnclip serve` and by --model to `cnclip migrate`.
MODEL_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("manifest not JSON", manifest_text("{not json"), "not valid JSON"),
    ("manifest nested 50,000 deep", manifest_text(DEEP), "nested too deeply"),
    ("manifest with a key twice", manifest_text('{"format": 1, "format": 2}'), "appears twice"),
    ("mean as strings", manifest_edit(mean=["0.5", "0.5", "0.5"]), "'mean' must be 3 finite numbers"),
    ("std of zero", manifest_edit(std=[0, 1, 1]), "'std' must be 3 finite numbers above 0"),
    ("towers.image an int", manifest_edit(towers__image=7), "tower 'image' must be an object"),
    ("image_size 225", manifest_edit(image_size=225), "manifest.json says [1, 3, 225, 225]"),
    ("embed_dim 10^30", manifest_edit(embed_dim=10**30), "'embed_dim' must lie in"),
    ("embed_dim the graphs do not give", manifest_edit(embed_dim=64), "manifest.json says [1, 64]"),
    ("context_length a string", manifest_edit(context_length="52"), "'context_length' has the wrong type"),
    ("logit_scale negative", manifest_edit(logit_scale=-1), "'logit_scale' must be a finite number"),
    ("a file outside the directory", manifest_edit(files={"../../etc/passwd": "0" * 64}), "leaves the model directory"),
    (
        "a bucket of 10^6",
        manifest_edit(
            towers__text={"input": "text", "output": "text_features", "graphs": {"fp32": {"1000000": "x.onnx"}}}
        ),
        "not a whole number",
    ),  # fmt: skip
    ("graph a FIFO", graph_replaced("fifo"), "is a FIFO, not a regular file"),
    ("graph a link to /dev/zero", graph_replaced("zero"), "is a character device"),
    ("graph an 8 GiB sparse file", graph_replaced("sparse"), "is larger than 2 GiB"),
    # Regular files whose read fails (EIO): one line, not an OSError from the sha256 loop or the reader.
    ("graph data a link to /proc/self/mem", linked_to("image.fp32.data", "/proc/self/mem"), "(Input/output error)"),
    ("manifest a link to /proc/self/mem", linked_to(MANIFEST_NAME, "/proc/self/mem"), "(Input/output error)"),
]


def _model_dirs(model: Path) -> dict[str, str]:
    return {"CNCLIP_MODEL_DIRS": json.dumps([str(model)])}


def assert_one_line(result: subprocess.CompletedProcess[str], words: str, status: int = 2) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == status, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert words in lines[0] and "Traceback" not in result.stderr, lines[0]


@pytest.mark.parametrize(("case", "env", "words"), SERVE_CASES, ids=[c[0] for c in SERVE_CASES])
def test_a_hostile_setting_stops_serve_in_one_line(
    case: str, env: Callable[[Path, Path], dict[str, str]], words: str, tmp_path: Path, toy: Path
) -> None:
    port = [] if "CNCLIP_PORT" in words else ["--port", "0"]
    result = run_cnclip(["serve", *port], base_env(tmp_path, toy, **env(tmp_path, toy)))
    # A storage file that cannot be used is an error of the storage (1, as a SQLite file that is no catalog).
    assert_one_line(result, words, 1 if case.startswith("storage") else 2)


@pytest.mark.parametrize(("case", "change", "words"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_a_hostile_model_directory_stops_serve_and_migrate_in_one_line(
    case: str, change: Callable[[Path], None], words: str, tmp_path: Path, toy: Path
) -> None:
    model = spoiled(toy, tmp_path, change)
    served = run_cnclip(["serve", "--port", "0"], base_env(tmp_path, toy, **_model_dirs(model)))
    assert_one_line(served, words)
    assert served.stderr.startswith("error: CNCLIP_MODEL_DIRS: ")
    migrated = run_cnclip(["migrate", "-c", "photos", "--model", str(model)], base_env(tmp_path, toy))
    assert_one_line(migrated, words)
    # The same rule, in-process: one ModelError, whatever the spoilage.
    with pytest.raises(ModelError) as caught:
        ModelManifest.load(model)
    assert words in caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize("host", ["localhost\udcff", "x\x01y"])
def test_a_host_that_cannot_be_bound_is_one_line(host: str, tmp_path: Path, toy: Path) -> None:
    """`CNCLIP_HOST` of bytes that are not UTF-8 was a TypeError traceback ("encoding of hostname failed")."""
    result = run_cnclip(["serve", "--port", "0"], base_env(tmp_path, toy, CNCLIP_HOST=host, CNCLIP_API_KEY="k"))
    assert_one_line(result, "cannot listen on", 1)


def test_watching_a_text_collection_is_refused_before_the_port_is_bound(tmp_path: Path, toy: Path) -> None:
    env = base_env(tmp_path, toy)
    texts = tmp_path / "notes.txt"
    texts.write_text("一只猫\n一只狗\n", encoding="utf-8")
    made = run_cnclip(["index-texts", str(texts), "-c", "notes"], env)
    assert made.returncode == 0, made.stdout + made.stderr
    folder = tmp_path / "photos"
    folder.mkdir()
    result = run_cnclip(["serve", "--port", "0"], {**env, "CNCLIP_WATCH": json.dumps({str(folder): "notes"})})
    assert_one_line(result, "holds texts")
    assert "Uvicorn running" not in result.stdout + result.stderr


def test_a_bad_setting_stops_serve_before_the_app_and_the_storage_are_imported(tmp_path: Path, toy: Path) -> None:
    """Their imports took ~1.9 s of the 3.1 s a bad setting's one line waited for (cli/serving.py)."""
    script = (
        "import sys\n"
        "from cli.main import main\n"
        "sys.argv = ['cnclip', 'serve', '--port', '0']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, [name for name in ('api.app', 'indexer.runtime') if name in sys.modules])\n"
    )
    env = base_env(tmp_path, toy, CNCLIP_STREAMS=str(CORES + 1))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.stdout.strip().splitlines()[-1] == "2 []", done.stdout + done.stderr
    assert "cores" in done.stderr and "Traceback" not in done.stderr


# --- files named by a model directory (not a setting): refused without a hang --------------------------
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_tuning_file_in_the_model_directory_that_is_no_file_is_refused_without_a_hang(
    kind: str, toy: Path, tmp_path: Path
) -> None:
    model = spoiled(toy, tmp_path, lambda d: None)
    path = model / TUNING_NAME
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    outcome: list[Any] = []
    reader = threading.Thread(target=lambda: outcome.append(read_tuning(path, "m", model)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert outcome, "read_tuning hung"
    assert outcome[0].tuning is None and "not a regular file" in outcome[0].line and "\n" not in outcome[0].line


@pytest.mark.parametrize("path", ["/proc/self/mem", "/proc/self/task/../mem"])
def test_a_regular_file_that_refuses_to_be_read_is_one_line(path: str, tmp_path: Path, toy: Path) -> None:
    """/proc/self/mem is a regular file of 0 bytes whose read fails (EIO): an `UnusableFile`, never an
    `OSError` traceback — as the tuning file a setting names, refused in one line and the defaults run."""
    with pytest.raises(UnusableFile, match="cannot be read"):
        read_regular(path, 1 << 20)
    outcome = read_tuning(Path(path), "m", toy)
    assert outcome.tuning is None and "cannot be read" in outcome.line and "\n" not in outcome.line


def test_the_shared_reader_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    fifo = fifo_at(tmp_path / "fifo")
    for path, words in ((fifo, "FIFO"), (Path("/dev/zero"), "character device"), (tmp_path, "directory")):
        with pytest.raises(UnusableFile, match=words):
            read_regular(path, 1 << 20)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2000)
    with pytest.raises(UnusableFile, match="larger than 1000 bytes"):
        read_regular(big, 1000)
    with pytest.raises(UnusableFile) as missing:
        read_regular(tmp_path / "nothing", 10)
    assert missing.value.missing
