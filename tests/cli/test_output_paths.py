"""Every command that writes a file or a folder checks where before its work (cli/output_paths.py): a
missing folder, a file where a folder should be, a folder or a FIFO where the file goes, or a place
nobody may write is one usage line (exit 2) at once, never after minutes of measuring or converting."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from cli.output_paths import check_output_file, check_output_folder, write_text_atomically

UNWRITABLE = Path("/proc")  # a folder even root cannot create files in


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_cli(), list(args))
    return result.exit_code, result.output


def never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the work started before the output path was checked")


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """Hostile places to write to, by what is wrong with them."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    os.mkfifo(tmp_path / "a-fifo")
    return {
        "missing folder": tmp_path / "missing" / "dir" / "out.json",
        "file as folder": tmp_path / "a-file" / "out.json",
        "folder as file": tmp_path / "a-folder",
        "fifo": tmp_path / "a-fifo",
        "unwritable": UNWRITABLE / "cnclip-out.json",
    }


FILE_ERRORS = {
    "missing folder": "does not exist",
    "file as folder": "not a folder",
    "folder as file": "is a folder; name a file",
    "fifo": "is a FIFO, not a regular file",
    "unwritable": f"cannot write in {UNWRITABLE}",
}
FOLDER_CASES = {  # the place, and what the error says; a missing folder is fine: the command creates it
    "file as folder": ("a-file", "is a file, not a folder"),
    "fifo": ("a-fifo", "is a FIFO, not a folder"),
    "under a file": ("a-file/model", "not a folder"),
    "unwritable": (str(UNWRITABLE / "cnclip-model"), f"cannot write in {UNWRITABLE}"),
}


@pytest.mark.parametrize("case", sorted(FILE_ERRORS))
@pytest.mark.parametrize("command", ["tune", "bench", "index"])
def test_file_outputs_are_checked_before_the_work(
    command: str, case: str, places: dict[str, Path], toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cli.indexing
    import retrieval.toolchain.bench
    import retrieval.toolchain.tune.report

    target = places[case]
    monkeypatch.setattr(retrieval.toolchain.tune.report, "run_tune", never)
    monkeypatch.setattr(retrieval.toolchain.bench, "run_sweep", never)
    monkeypatch.setattr(cli.indexing, "storage_settings", never)
    model = str(toy_model_dir)
    args, option = {
        "tune": (["tune", "--model", model, "--out", str(target)], "--out"),
        "bench": (["bench", "encoders", "--model", model, "--json", str(target)], "--json"),
        "index": (["index", model, "-c", "photos", "--report", str(target)], "--report"),
    }[command]
    if command == "index" and case == "missing folder":  # the report's folders are created: that is allowed
        code, output = run(*args)
        assert "does not exist" not in output and isinstance(code, int)
        return
    code, output = run(*args)
    assert code == 2, output
    flat = " ".join(output.split())
    assert option in flat and FILE_ERRORS[case] in flat, output


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
@pytest.mark.parametrize("command", ["convert", "export-triton", "models pull"])
def test_folder_outputs_are_checked_before_the_work(
    command: str, case: str, places: dict[str, Path], toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cli.models
    import retrieval.toolchain.convert.checkpoint
    import retrieval.toolchain.triton.export

    monkeypatch.setattr(retrieval.toolchain.convert.checkpoint, "model_from_options", never)
    monkeypatch.setattr(retrieval.toolchain.triton.export, "export_triton_repository", never)
    monkeypatch.setattr(cli.models, "download", never)
    name, expected = FOLDER_CASES[case]
    target = places["fifo"].parent / name
    args = {
        "convert": ["convert", "--arch", "RN50", "--random-init", "--out", str(target)],
        "export-triton": ["export-triton", "--model", str(toy_model_dir), "--out", str(target)],
        "models pull": ["models", "pull", "RN50", "--dir", str(target)],
    }[command]
    code, output = run(*args)
    assert code == 2, output
    flat = " ".join(output.split())
    assert ("--dir" if command == "models pull" else "--out") in flat and expected in flat, output


def test_tune_to_a_missing_folder_fails_at_once_not_after_measuring(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retrieval.toolchain.tune.report

    monkeypatch.setattr(retrieval.toolchain.tune.report, "run_tune", never)
    code, output = run("tune", "--model", str(toy_model_dir), "--out", str(tmp_path / "missing/dir/tuning.json"))
    assert code == 2 and f"the folder {tmp_path / 'missing/dir'} does not exist" in " ".join(output.split())


def test_a_good_place_passes_and_the_check_leaves_nothing_behind(tmp_path: Path) -> None:
    assert check_output_file(tmp_path / "out.json", "--out") == tmp_path / "out.json"
    assert check_output_file(tmp_path / "new" / "deeper" / "r.jsonl", "--report", create_folders=True)
    assert check_output_folder(tmp_path / "model" / "v1", "--out") == tmp_path / "model" / "v1"
    (tmp_path / "existing.json").write_text("{}")
    assert check_output_file(tmp_path / "existing.json", "--out")  # replaced by the write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.json"]  # no probe file, no folder made


def test_writing_replaces_a_fifo_put_there_after_the_check_without_blocking(tmp_path: Path) -> None:
    target = tmp_path / "points.json"
    os.mkfifo(target)  # a reader-less FIFO: open(target, "w") would block forever
    write_text_atomically(target, "{}\n", "--json")
    assert stat.S_ISREG(target.stat().st_mode) and target.read_text() == "{}\n"
    assert os.stat(target).st_mode & 0o777 == 0o666 & ~_umask()  # as `open(..., "w")` would have made it
    assert [p.name for p in tmp_path.iterdir()] == ["points.json"]


def test_convert_names_a_wrong_architecture_before_the_checkpoint(tmp_path: Path) -> None:
    code, output = run("convert", "--arch", "NOPE", "--out", str(tmp_path / "m"))  # and no --checkpoint
    assert code == 1 and output.startswith("error: unknown architecture 'NOPE' (--arch)")  # convert's own errors
    flat = " ".join(output.split())
    assert "unknown architecture 'NOPE'" in flat and "RN50, ViT-B-16, ViT-L-14, ViT-L-14-336, ViT-H-14" in flat
    assert "checkpoint" not in flat.lower()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
