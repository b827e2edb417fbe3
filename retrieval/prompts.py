"""Zero-shot prompts: the one validator for labels and templates (saving a label set and
classifying both call it) and the one way a label goes into a template.

A template holds exactly one `{}`, which is replaced by the label *literally*: user text never
reaches `str.format`, whose field syntax (`{:>10000000}`, `{0.__class__}`, `{!z}`) lets a template
allocate without bound, read attributes or raise. Every other brace is refused, with the reason.
The whole request's cost is bounded before any work: at most `MAX_PROMPT_TEXTS` prompt texts
(labels × templates), each at most `MAX_TEMPLATE_CHARS + MAX_LABEL_CHARS` characters, so
tokenizing and embedding them stays small whatever the client sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.errors import InvalidInput

PLACEHOLDER = "{}"
MAX_LABELS = 100
MAX_LABEL_CHARS = 100
MAX_TEMPLATES = 10
MAX_TEMPLATE_CHARS = 200
# labels × templates per request: the most labels with the most templates (or the 10 defaults) fit.
MAX_PROMPT_TEXTS = MAX_LABELS * MAX_TEMPLATES
# The same rule as `template_problem`, as a JSON Schema pattern for the OpenAPI document.
TEMPLATE_PATTERN = r"^[^{}]*\{\}[^{}]*$"


def template_problem(template: object) -> str | None:
    """Why `template` cannot be used, or None when it can."""
    if not isinstance(template, str) or not template.strip():
        return "a template must be a non-empty string"
    if len(template) > MAX_TEMPLATE_CHARS:
        return f"template {template[:20]!r}... is longer than {MAX_TEMPLATE_CHARS} characters"
    if template.count(PLACEHOLDER) != 1:
        return f"template {template!r} must contain exactly one {{}} where the label goes, e.g. 一张{{}}的照片"
    if "{" in template.replace(PLACEHOLDER, "", 1) or "}" in template.replace(PLACEHOLDER, "", 1):
        return f"template {template!r} has a brace besides its one {{}}; other braces are not allowed"
    return None


def check_template(template: str) -> str:
    """`template` if usable, else `InvalidInput` saying why."""
    problem = template_problem(template)
    if problem is not None:
        raise InvalidInput(problem)
    return template


def check_prompts(labels: Sequence[str], templates: Sequence[str]) -> None:
    """Labels and templates of one request (or label set): counts, lengths, braces and total cost."""
    if not labels:
        raise InvalidInput("give at least one label")
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"at most {MAX_LABELS} labels per request (got {len(labels)})")
    for label in labels:
        if not isinstance(label, str) or not label.strip():
            raise InvalidInput("labels must be non-empty strings")
        if len(label) > MAX_LABEL_CHARS:
            raise InvalidInput(f"label {label[:20]!r}... is longer than {MAX_LABEL_CHARS} characters")
    if len(set(labels)) != len(labels):
        raise InvalidInput("labels must be distinct")
    if not templates or len(templates) > MAX_TEMPLATES:
        raise InvalidInput(f"give between 1 and {MAX_TEMPLATES} templates")
    for template in templates:
        check_template(template)
    if len(labels) * len(templates) > MAX_PROMPT_TEXTS:
        raise InvalidInput(
            f"{len(labels)} labels × {len(templates)} templates = {len(labels) * len(templates)} prompts; "
            f"at most {MAX_PROMPT_TEXTS} per request"
        )


def fill(template: str, label: str) -> str:
    """The prompt text: `template` with its one `{}` replaced by `label`, literally."""
    return template.replace(PLACEHOLDER, label, 1)
