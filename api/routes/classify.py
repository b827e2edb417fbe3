"""Zero-shot classification: an image and candidate labels in, probabilities out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from api.deps import EncoderDep, LabelSetsDep, MetricsDep, ReadAccess, SettingsDep, run_blocking
from api.guarded_route import GuardedRoute
from api.schemas import NAME_PATTERN, LabelProbability
from api.searching import StageTimer
from api.uploads import inspect_image, parse_string_list, read_upload
from retrieval.errors import InvalidInput
from retrieval.prompts import MAX_LABEL_CHARS, MAX_LABELS, MAX_TEMPLATE_CHARS, MAX_TEMPLATES, check_prompts

router = APIRouter(prefix="/v1", tags=["classify"], dependencies=[ReadAccess], route_class=GuardedRoute)


@router.post("/classify", response_model=list[LabelProbability])
async def classify(
    request: Request,
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    encoder: EncoderDep,
    settings: SettingsDep,
    label_sets: LabelSetsDep,
    metrics: MetricsDep,
    labels: Annotated[
        str | None, Form(description='Candidate labels: a JSON list (["猫","狗"]) or comma-separated (猫,狗).')
    ] = None,
    label_set: Annotated[str | None, Form(pattern=NAME_PATTERN, description="Name of a saved label set.")] = None,
    templates: Annotated[
        str | None,
        Form(description='Prompt templates with {}: JSON list, e.g. ["一张{}的照片"]. Default: the model\'s.'),
    ] = None,
) -> list[LabelProbability]:
    """Probabilities over `labels` (or a saved `label_set`), highest first; they sum to 1."""
    timer = StageTimer()
    candidates = parse_string_list(labels, "labels", MAX_LABELS, MAX_LABEL_CHARS)
    prompt_templates = (
        parse_string_list(templates, "templates", MAX_TEMPLATES, MAX_TEMPLATE_CHARS) if templates else None
    )
    if candidates is not None and label_set:
        raise InvalidInput("send either labels or label_set, not both")
    if label_set:
        saved = await run_blocking(label_sets.get, label_set)
        candidates = saved["labels"]
        prompt_templates = prompt_templates or saved.get("templates")
    if not candidates:
        raise InvalidInput("send labels (a JSON list or comma-separated) or the name of a saved label_set")
    # Saved sets are checked again: a file written by an older version may hold what is now refused.
    check_prompts(candidates, prompt_templates or request.app.state.zeroshot.templates)
    data = await read_upload(file, settings.max_image_bytes)
    await run_blocking(inspect_image, data, settings)
    timer.mark("read")
    scored = await request.app.state.zeroshot.classify(data, candidates, templates=prompt_templates)
    timer.mark("classify")
    metrics.observe_stages("classify", timer.finish())
    ranked = sorted(scored, key=lambda pair: pair[1], reverse=True)
    return [LabelProbability(label=label, probability=round(float(p), 6)) for label, p in ranked]
