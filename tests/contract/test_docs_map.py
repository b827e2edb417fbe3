"""The docs a newcomer navigates stay whole and true: the README's map links every page under docs/;
every relative link (and its #anchor) in README.md, docs/*.md and the demo model card leads somewhere; every repository
path they name exists; every `cnclip` command in their shell blocks parses as the program would parse
it (a real command, real options, values in range) and every one named in their prose is a real
command with real options; the README's command table lists every command; the other commands of
their shell blocks (`python -m`, `python -c`, `make`) name real modules, valid code and real targets.

A page's runnable examples are run by the tests of what they show: docs/triton.md's tritonclient
example by tests/system/test_real_triton.py, the settings table checked by tests/contract/test_settings_doc.py."""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import typer.main

from cli.main import build_cli as build_cnclip_app
from tests.support.markdown_docs import (
    DOCS,
    README,
    REPO_ROOT,
    SHELL_LANGUAGES,
    anchors,
    fenced_blocks,
    links,
    named_paths,
    pages,
    prose,
    shell_commands,
)

PAGES = pages()
PAGE_IDS = [page.relative_to(REPO_ROOT).as_posix() for page in PAGES]
HELP_OPTIONS = {"-h", "--help"}


@functools.cache
def cnclip() -> Any:
    """The `cnclip` program's command tree (typer's click-style group)."""
    return typer.main.get_command(build_cnclip_app())


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def leaf_commands(command: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The path of every command that runs something (`("models", "pull")`)."""
    if not is_group(command):
        return {path}
    return set().union(*(leaf_commands(sub, (*path, name)) for name, sub in command.commands.items()))


def parse_cnclip(args: Sequence[str]) -> None:
    """Parse `cnclip ARGS` as the program does, without running anything: an unknown command or
    option, a missing or extra argument or a value out of range raises."""
    command = cnclip()
    words = list(args)
    context = command.make_context("cnclip", words)
    while is_group(command):
        # A group stops parsing at its command's name: what follows the name is left in args.
        name = words[len(words) - len(context.args) - 1]
        if name not in command.commands:
            raise ValueError(f"{context.command_path} has no command {name!r}")
        command, words = command.commands[name], list(context.args)
        context = command.make_context(name, words, parent=context)


def known_options(command: Any) -> set[str]:
    names = set(HELP_OPTIONS)
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts, param.secondary_opts)
    return names


def mention_problem(words: list[str]) -> str | None:
    """What is wrong with `cnclip …` as named in prose (placeholders such as NAME, DIR and `…`
    allowed): a command or an option that does not exist."""
    command, path = cnclip(), ["cnclip"]
    for raw in words:
        word = raw.strip("[],:;")
        word = re.sub(r"^-(\w)\1+$", r"-\1", word)  # -vv is -v twice
        option = word.split("=", 1)[0]
        if word.startswith("-") and word != "--":
            if option not in known_options(command):
                return f"`{' '.join(path)}` has no option {option}"
        elif is_group(command) and word:
            if word.isupper():
                return None  # `cnclip COMMAND -h`: a placeholder for any command
            if word not in command.commands:
                return f"`{' '.join(path)}` has no command {word!r}"
            command = command.commands[word]
            path.append(word)
    return None


def inline_cnclip_mentions(text: str) -> list[list[str]]:
    """The words after `cnclip` in every inline code span of the prose that runs it."""
    mentions = []
    for span in re.findall(r"`([^`\n]+)`", prose(text)):
        words = span.replace("…", " ").replace("...", " ").split()
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if len(words) > 1 and words[0] == "cnclip":
            mentions.append(words[1:])
    return mentions


def test_the_readme_maps_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, "README.md has no '## Documentation' section"
    mapped = {(README.parent / target.split("#")[0]).resolve() for target in links(match.group(1))}
    unmapped = [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in mapped]
    assert unmapped == [], "pages missing from the README's Documentation map"


def link_problem(page: Path, target: str) -> str | None:
    """Why a relative link from `page` leads nowhere, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None  # http:, https:, mailto: — not ours to check
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    if not destination.is_relative_to(REPO_ROOT):
        return f"{target}: outside the repository"
    if not destination.exists():
        return f"{target}: no such file"
    if anchor and destination.suffix == ".md" and anchor not in anchors(destination.read_text(encoding="utf-8")):
        return f"{target}: {destination.name} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    targets = links(page.read_text(encoding="utf-8"))
    problems = [problem for target in targets if (problem := link_problem(page, target))]
    assert problems == []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_repository_path_the_docs_name_exists(page: Path) -> None:
    missing = sorted(p for p in named_paths(page.read_text(encoding="utf-8")) if not (REPO_ROOT / p).exists())
    assert missing == [], f"{page.name} names paths that do not exist"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_cnclip_command_in_a_shell_block_parses(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    commands = [c for c in shell_commands(text) if c.words[0] == "cnclip"]
    shown = any(re.search(r"\bcnclip ", body) for lang, body in fenced_blocks(text) if lang in SHELL_LANGUAGES)
    assert bool(commands) == shown, "a shell block runs cnclip, but no command was read from it"
    problems = []
    for command in commands:
        try:
            parse_cnclip(command.words[1:])
        except Exception as exc:  # typer's usage errors have no public base class
            problems.append(f"{command.line}: {exc}")
    assert problems == []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_cnclip_command_named_in_the_prose_exists(page: Path) -> None:
    mentions = inline_cnclip_mentions(page.read_text(encoding="utf-8"))
    problems = [f"cnclip {' '.join(m)}: {problem}" for m in mentions if (problem := mention_problem(m))]
    assert problems == []


def test_the_readme_command_table_lists_every_command() -> None:
    text = README.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `cnclip")]
    listed = set()
    for row in rows:
        for words in inline_cnclip_mentions(row.split(" | ")[0]):
            path = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
            listed.update(tuple(path[:n]) for n in range(1, len(path) + 1))
    assert sorted(leaf_commands(cnclip()) - listed) == [], "commands missing from the README's command table"


def other_command_problem(words: tuple[str, ...]) -> str | None:
    """`python -m MODULE`, `python -c CODE`, `python FILE` and `make TARGET` name real things."""
    if words[0] in ("python", "python3") and len(words) > 2 and words[1] == "-m":
        return None if importlib.util.find_spec(words[2]) else f"no module {words[2]}"
    if words[0] in ("python", "python3") and len(words) > 2 and words[1] == "-c":
        try:
            compile(words[2], "<docs>", "exec")
        except SyntaxError as exc:
            return f"python -c: {exc}"
        return None
    if words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
        return None if (REPO_ROOT / words[1]).is_file() else f"no file {words[1]}"
    if words[0] == "make":
        makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
        targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
        unknown = [t for t in words[1:] if not t.startswith("-") and "=" not in t and t not in targets]
        return f"make has no target {unknown}" if unknown else None
    return None


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_python_and_make_commands_in_shell_blocks_name_real_things(page: Path) -> None:
    commands = shell_commands(page.read_text(encoding="utf-8"))
    problems = [f"{c.line}: {problem}" for c in commands if (problem := other_command_problem(c.words))]
    assert problems == []


# --- the checks themselves fail for the reason their names give -------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "cnclip serch 红色",  # no such command
        "cnclip search 红色 --frobnicate",  # no such option
        "cnclip search 红色 -k 201",  # out of range
        "cnclip search 红色 --sort newest",  # not a choice
        "cnclip search",  # its argument is missing
        "cnclip models fetch ViT-B-16",  # no such subcommand
        "cnclip -q stats",  # no such global option
    ],
)
def test_parse_cnclip_refuses_what_the_program_refuses(line: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - typer's usage errors have no public base class
        parse_cnclip(shlex.split(line)[1:])


def test_parse_cnclip_accepts_global_options_and_nested_commands() -> None:
    parse_cnclip(["-vv", "search", "海边", "-c", "photos", "--min-score", "0.3", "--sort", "taken"])
    parse_cnclip(["models", "pull", "ViT-B-16", "--dir", "/tmp/x"])
    parse_cnclip(["triton-server", "repo", "--", "--model-control-mode=explicit"])


def test_mentions_catch_renamed_commands_and_options() -> None:
    assert mention_problem(["index", "FOLDER", "--collection", "NAME"]) is None
    assert mention_problem(["COMMAND", "-h"]) is None
    assert mention_problem(["-v", "search"]) is None
    assert mention_problem(["index", "--purge"]) == "`cnclip index` has no option --purge"
    assert mention_problem(["indexer"]) == "`cnclip` has no command 'indexer'"


def test_link_and_path_checks_notice_what_is_missing(tmp_path: Path) -> None:
    page = DOCS / "settings.md"
    assert link_problem(page, "api.md#errors") is None
    assert (
        link_problem(page, "api.md#no-such-heading") == "api.md#no-such-heading: api.md has no heading #no-such-heading"
    )
    assert link_problem(page, "nothing.md") == "nothing.md: no such file"
    assert link_problem(page, "../../outside.md") == "../../outside.md: outside the repository"
    assert named_paths("see `indexer/nothing.py` and api/gone.py, not `data_dir/thumbs`") == {
        "indexer/nothing.py",
        "api/gone.py",
    }
