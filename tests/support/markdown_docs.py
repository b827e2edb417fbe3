"""Reading the project's Markdown docs for tests/contract/test_docs_map.py: the pages, their fenced blocks,
links, headings (as GitHub turns them into anchors), repository paths they name, and the shell
commands their shell blocks run."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from retrieval.config import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
# A path into the repository: a top-level folder of this project, then a path. In backquotes any such
# path counts (folders too); in plain prose, one that ends in a file name with an extension.
TOP_FOLDERS = r"(?:api|retrieval|indexer|demo|web|migrations|models|benchmarks|tests|docs|cli|\.ci)"
CODE_PATH = re.compile(rf"{TOP_FOLDERS}/[\w./-]*")
PROSE_PATH = re.compile(rf"(?<![\w./-]){TOP_FOLDERS}/[\w/-]+(?:\.[\w-]+)*\.(?:py|md|json|txt|toml|ini|html|js|css)\b")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


MODEL_CARD = REPO_ROOT / "models" / "cnclip-demo" / "MODEL_CARD.md"


def pages() -> list[Path]:
    """The README, every page under docs/ and the demo model's card (its commands retrain the model).
    BENCHMARKS.md is a dated record of runs, kept as they were run."""
    return [README, *sorted(DOCS.glob("*.md")), MODEL_CARD]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text without its fenced code blocks (a `#` comment in a shell block is no heading)."""
    return FENCE.sub("", text)


def links(text: str) -> list[str]:
    """Targets of the Markdown links and images in the prose."""
    return LINK.findall(prose(text))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for match in HEADING.finditer(prose(text)):
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        result.add(anchor if count == 0 else f"{anchor}-{count}")
    return result


def named_paths(text: str) -> set[str]:
    """Repository paths the prose names, in backquotes or plainly."""
    body = re.sub(r"\]\([^)\s]*\)", "]", prose(text))  # link targets are checked as links
    in_code = {span for span in INLINE_CODE.findall(body) if CODE_PATH.fullmatch(span)}
    plain = set(PROSE_PATH.findall(INLINE_CODE.sub(" ", body)))
    return in_code | plain


@dataclass(frozen=True)
class ShellCommand:
    """One simple command of a shell block: its words, environment assignments removed."""

    words: tuple[str, ...]
    line: str


def _logical_lines(body: str) -> list[str]:
    """The block's lines with backslash continuations joined and here-document bodies left out."""
    lines: list[str] = []
    pending = ""
    terminator: str | None = None
    for raw in body.splitlines():
        if terminator is not None:
            terminator = None if raw.strip() == terminator else terminator
            continue
        pending += raw[:-1] + " " if raw.endswith("\\") else raw
        if raw.endswith("\\"):
            continue
        heredoc = HEREDOC.search(pending)
        if heredoc:
            terminator = heredoc.group(2)
        lines.append(pending)
        pending = ""
    return lines


def _split_line(line: str) -> list[list[str]]:
    """The simple commands of one line, split at shell operators, without comments or redirections."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in SHELL_OPERATORS:
            commands.append([])
        elif token in REDIRECTS or token.startswith("<<"):
            skip_next = True  # the file or here-document word after it
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def shell_commands(text: str) -> list[ShellCommand]:
    """Every simple command in the text's shell blocks (```bash, ```sh, ...)."""
    found = []
    for language, body in fenced_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        for line in _logical_lines(body):
            for words in _split_line(line):
                while words and ASSIGNMENT.match(words[0]):
                    words = words[1:]
                if words:
                    found.append(ShellCommand(tuple(words), line.strip()))
    return found
