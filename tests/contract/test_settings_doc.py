"""Every field of `Settings` has a row in the settings table of docs/settings.md (env var, default,
description), and every row is a real field. Regenerate the table after adding a setting:

    python -m tests.contract.test_settings_doc
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from api.config import Settings
from retrieval.config import REPO_ROOT

SETTINGS_PAGE = REPO_ROOT / "docs" / "settings.md"
HEADER = "| Variable | Default | Description |\n| --- | --- | --- |"


def env_name(field: str) -> str:
    return f"CNCLIP_{field.upper()}"


def render_default(value: Any) -> str:
    """The default as a user would write it in the environment."""
    if value is None or (isinstance(value, SecretStr) and not value.get_secret_value()):
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, list | dict):
        return f"`{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}`"
    if isinstance(value, Path):
        if value.is_relative_to(REPO_ROOT):
            return f"`{value.relative_to(REPO_ROOT).as_posix()}`"
        if value.is_relative_to(Path.home()):
            return f"`~/{value.relative_to(Path.home()).as_posix()}`"
    return f"`{value}`"


def render_description(text: str | None) -> str:
    return (text or "").replace("|", "\\|").strip()


def render_table() -> str:
    rows = [
        f"| `{env_name(name)}` | {render_default(field.get_default(call_default_factory=True))} | "
        f"{render_description(field.description)} |"
        for name, field in Settings.model_fields.items()
    ]
    return "\n".join([HEADER, *rows])


def documented_rows() -> dict[str, tuple[str, str]]:
    """env var -> (default cell, description cell) from the settings page's table: the rows that
    follow its header line, up to the first line that is not a table row."""
    text = SETTINGS_PAGE.read_text(encoding="utf-8")
    assert text.count(HEADER) == 1, f"{SETTINGS_PAGE.name} needs exactly one table headed {HEADER!r}"
    table = re.match(r"(?:\|.*\n?)*", text.split(HEADER, 1)[1].lstrip("\n"))
    rows = {}
    for line in table.group(0).splitlines() if table else []:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`CNCLIP_"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_every_setting_is_documented_with_its_default_and_description() -> None:
    documented = documented_rows()
    fields = {env_name(name): field for name, field in Settings.model_fields.items()}
    assert sorted(set(fields) - set(documented)) == [], (
        "settings missing from docs/settings.md (python -m tests.contract.test_settings_doc)"
    )
    assert sorted(set(documented) - set(fields)) == [], "docs/settings.md documents settings that do not exist"
    for env, field in fields.items():
        default, description = documented[env]
        assert default == render_default(field.get_default(call_default_factory=True)), env
        assert description == render_description(field.description), env
        assert description, f"{env} has no description in Settings"


def test_the_check_notices_a_missing_row(monkeypatch: Any, tmp_path: Path) -> None:
    page = tmp_path / "settings.md"
    table = render_table()
    page.write_text(f"# Settings\n\n{table}\n\n## Next\n\n| `CNCLIP_LATER` | x | y |\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "SETTINGS_PAGE", page)
    assert set(documented_rows()) == {env_name(n) for n in Settings.model_fields}  # the table ends at its end
    page.write_text(f"# Settings\n\n{table.replace('CNCLIP_PORT', 'CNCLIP_PORTS')}\n", encoding="utf-8")
    assert "CNCLIP_PORT" not in documented_rows()


if __name__ == "__main__":
    print(render_table())
