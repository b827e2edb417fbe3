"""Every field of `Settings` has a row in the README's Settings table (env var, default,
description), and every row is a real field. Regenerate the table after adding a setting:

    python -m tests.test_settings_doc
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from api.config import Settings
from retrieval.config import REPO_ROOT

README = REPO_ROOT / "README.md"
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
    """env var -> (default cell, description cell) from the README's Settings section."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Settings\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, "README.md has no '## Settings' section"
    rows = {}
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`CNCLIP_"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_every_setting_is_documented_with_its_default_and_description() -> None:
    documented = documented_rows()
    fields = {env_name(name): field for name, field in Settings.model_fields.items()}
    assert sorted(set(fields) - set(documented)) == [], (
        "settings missing from README (python -m tests.test_settings_doc)"
    )
    assert sorted(set(documented) - set(fields)) == [], "README documents settings that do not exist"
    for env, field in fields.items():
        default, description = documented[env]
        assert default == render_default(field.get_default(call_default_factory=True)), env
        assert description == render_description(field.description), env
        assert description, f"{env} has no description in Settings"


def test_the_check_notices_a_missing_row(monkeypatch: Any, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    table = render_table()
    readme.write_text(f"# x\n\n## Settings\n\n{table}\n\n## Next\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "README", readme)
    assert set(documented_rows()) == {env_name(n) for n in Settings.model_fields}
    readme.write_text(f"## Settings\n\n{table.replace('CNCLIP_PORT', 'CNCLIP_PORTS')}\n\n## Next\n", encoding="utf-8")
    assert "CNCLIP_PORT" not in documented_rows()


if __name__ == "__main__":
    print(render_table())
