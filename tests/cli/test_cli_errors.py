"""One table maps the project's errors to exit statuses (cli/errors.py), the command line's mirror of the
API's `STATUS_BY_ERROR`: every error the API maps has a status the README documents, the table ends
like the API's (the base class last), and every command applies it through the one handler."""

from __future__ import annotations

import ast
from pathlib import Path

from typer.testing import CliRunner

from api.errors import STATUS_BY_ERROR, http_status
from cli.errors import EXIT_BY_ERROR, EXIT_ERROR, EXIT_USAGE, BadSetting, exit_status
from cli.main import build_cli
from indexer.errors import DatabaseUnavailable, VectorStoreBusy
from retrieval.errors import CnclipError, InvalidInput, ModelError, NotFound

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = {0, 1, 2, 3, 130}  # the README's "Exit status" list


def test_every_error_the_api_maps_has_a_documented_exit_status() -> None:
    for cls, _status in STATUS_BY_ERROR:
        assert exit_status(cls("x")) in DOCUMENTED, cls
    # Both tables end with the base class: an error added later is mapped, never a traceback.
    assert EXIT_BY_ERROR[-1][0] is STATUS_BY_ERROR[-1][0] is CnclipError
    assert exit_status(BadSetting("CNCLIP_X: bad")) == EXIT_USAGE
    for error in (InvalidInput("x"), NotFound("x"), DatabaseUnavailable("x"), VectorStoreBusy("x"), ModelError("x")):
        assert exit_status(error) == EXIT_ERROR and http_status(error) >= 400


def test_a_project_error_is_one_line_and_its_status(tmp_path: Path) -> None:
    env = {"CNCLIP_DATA_DIR": str(tmp_path / "data")}
    missing = CliRunner().invoke(build_cli(), ["index", str(tmp_path / "nope"), "-c", "photos"], env=env)
    assert missing.exit_code == EXIT_ERROR and missing.output == f"error: {tmp_path / 'nope'} does not exist\n"
    bad_name = CliRunner().invoke(build_cli(), ["reindex", "-c", "a b"], env=env)
    assert (
        bad_name.exit_code == EXIT_ERROR
        and bad_name.output.startswith("error: ")
        and "Traceback" not in bad_name.output
    )


def test_no_command_prints_its_own_error_line() -> None:
    """Commands raise; cli/errors.py says it. A hand-written `error:` line elsewhere in cli/ would
    bypass the table (and could give another status for the same error)."""
    offenders = set()
    for path in sorted((ROOT / "cli").glob("*.py")):
        if path.name == "errors.py":
            continue
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("error: "):
                    offenders.add(f"{path.name}:{function.name}")
    assert offenders == set(), offenders


def test_a_bad_setting_is_one_line_per_variable_and_status_2_for_every_command(tmp_path: Path) -> None:
    """Whichever command reads the settings, and whichever way pydantic fails (a value out of range,
    a list that is not JSON), the user sees the variable's name, not a traceback."""
    env = {"CNCLIP_DATA_DIR": str(tmp_path / "data")}
    cases = [
        ({"CNCLIP_BUCKETS": "abc"}, "error: CNCLIP_BUCKETS: is not valid JSON"),
        ({"CNCLIP_SYNC_INTERVAL_S": "-1"}, "error: CNCLIP_SYNC_INTERVAL_S: Input should be greater than or equal to 0"),
        ({"CNCLIP_PORT": "x"}, "error: CNCLIP_PORT: Input should be a valid integer"),
    ]
    commands = [["stats"], ["index", str(tmp_path), "-c", "photos"], ["demo", "--no-serve"], ["serve"], ["worker"]]
    for bad, line in cases:
        for command in commands:
            if "PORT" in next(iter(bad)) and command[0] not in ("serve", "demo", "worker"):
                continue  # only the servers read the port
            result = CliRunner().invoke(build_cli(), command, env={**env, **bad})
            assert result.exit_code == EXIT_USAGE, (bad, command, result.output)
            assert result.output.startswith(line) and "Traceback" not in result.output, (bad, command, result.output)
            assert len(result.output.splitlines()) == 1, (bad, command, result.output)
