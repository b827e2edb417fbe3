"""Request and response bodies of the REST API. Separate from the catalog's records: the API
decides what clients see (urls, not paths) and validates what they send (lengths, counts)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, field_validator

from indexer.domain.exclusion import MAX_EXCLUDED
from indexer.domain.names import COLLECTION_NAME_PATTERN
from indexer.domain.paging import MAX_CANDIDATES, MAX_PAGE, SortOrder
from indexer.domain.text_query import SearchMode
from retrieval.prompts import (
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATES,
    TEMPLATE_PATTERN,
    template_problem,
)

MAX_QUERY_CHARS = 512
MAX_K = MAX_PAGE  # one limit for the API and `cnclip search -k`
MAX_OFFSET = MAX_CANDIDATES - 1  # result lists end at MAX_CANDIDATES (indexer/domain/paging.py)
MAX_EMBED_TEXTS = 256
MAX_EMBED_IMAGES = 32
MAX_TEXTS_PER_REQUEST = 1000
MAX_TAGS = 50
MAX_TAG_CHARS = 64
# A character takes up to 6 bytes in JSON (`\uXXXX`, as json.dumps writes non-ASCII by default).
_JSON_BYTES_PER_CHAR = 6

# Label-set names follow the collection-name rule (indexer/domain/names.py): one pattern for every name.
NAME_PATTERN = COLLECTION_NAME_PATTERN

# Stripped strings must keep a character: `pattern=r"\S"` says so in the OpenAPI document too.
Query = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_QUERY_CHARS, pattern=r"\S")
]
Label = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_LABEL_CHARS, pattern=r"\S")
]
Tag = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TAG_CHARS, pattern=r"\S")]
# Checked by `template_problem` (a clearer message than a pattern's); documented with its pattern.
Template = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TEMPLATE_CHARS),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_TEMPLATE_CHARS, "pattern": TEMPLATE_PATTERN}),
]
CollectionName = Annotated[str, StringConstraints(pattern=COLLECTION_NAME_PATTERN)]
# SQL primary keys are signed 64-bit; anything outside is refused at the edge (SQLite would overflow).
MAX_ITEM_ID = 2**63 - 1
ItemId = Annotated[int, PathParam(ge=1, le=MAX_ITEM_ID, description="An item id (1..2^63-1).")]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # What a request body of this schema may cost, counted while it arrives (api/guarded_route.py): more is
    # a 413 before anything is parsed. The defaults hold every request body but `AddTextsRequest` with room
    # to spare (256 texts of 512 escaped characters are 0.8 MB); 200k unknown keys cost seconds to report.
    max_body_bytes: ClassVar[int] = 1 << 20
    max_json_values: ClassVar[int] = 4096


class Filters(StrictModel):
    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS, description="An item must carry every tag.")
    mime: list[str] | None = Field(None, max_length=10, description="An item's mime type must be one of these.")
    date_from: datetime | None = Field(None, description="Added at or after (ISO 8601).")
    date_to: datetime | None = Field(None, description="Added at or before (ISO 8601).")
    taken_from: datetime | None = Field(
        None, description="Taken at or after (ISO 8601; see taken_at). Items with no date never pass."
    )
    taken_to: datetime | None = Field(None, description="Taken at or before (ISO 8601).")


MIN_SCORE_DOC = (
    "Relevance cutoff: results with a lower cosine score are left out (and counted in below_cutoff). "
    "Default: none. GET /v1/collections suggests one per model."
)
SORT_DOC = (
    "relevance: best score first; taken: newest photo first (undated last); added: newest indexed first. "
    "Dates order the results above min_score among the candidates (at most 1000)."
)
MODE_DOC = (
    "clip: the CLIP vector search of the query as typed. text: the photos whose recognised text holds the "
    "query's words (spaces, case and full width ignored), best covered first. hybrid: both rankings merged by "
    "reciprocal-rank fusion, so a photo of a sign saying the words comes first and a query no text holds keeps "
    "the CLIP order. Default: hybrid on collections with ocr, clip elsewhere (docs/api.md, Text in photos)."
)
OFFSET_DOC = "Results to skip (paging). A result list ends at 1000: a page past it is cut short."
EXCLUDE_DOC = (
    f"Texts the results should not show (at most {MAX_EXCLUDED}, each like a query), e.g. 人: results matching one "
    "clearly more than the candidates do are pushed down; score is then the cosine minus that penalty "
    "(docs/api.md, Queries that exclude)."
)


class PageFields(StrictModel):
    """Cutoff, order and page: the same fields for every search."""

    k: int = Field(20, ge=1, le=MAX_K, description="How many results (one page).")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description=OFFSET_DOC)
    min_score: float | None = Field(None, ge=-1.0, le=1.0, description=MIN_SCORE_DOC)
    sort: SortOrder = Field("relevance", description=SORT_DOC)


class TextSearchRequest(PageFields):
    query: Query = Field(
        description='Text to search for, at most 512 characters. In mode text and hybrid a quoted part ("会议室") '
        "is a hard filter: every result's recognised text holds it.",
        examples=["穿红色裙子的女孩"],
    )
    collection: CollectionName | None = Field(None, description="Defaults to the default image collection.")
    filters: Filters | None = None
    exclude: list[Query] = Field(default_factory=list, max_length=MAX_EXCLUDED, description=EXCLUDE_DOC)
    mode: SearchMode | None = Field(None, description=MODE_DOC)


class MatchedText(BaseModel):
    """Where the query is in the item's recognised text (`ocr_text`): `ocr_text[start:end]`, offsets in
    Unicode code points; `line` is the recognised line the match starts in, at `line_start` of ocr_text."""

    text: str = Field(description="The matched characters as recognised (the query's normal form may differ).")
    start: int
    end: int
    line: str
    line_start: int


class SearchResult(BaseModel):
    id: int
    score: float = Field(
        description="Cosine similarity, -1..1 (modes clip and hybrid); mode text and a query of quoted parts only: "
        "the share of the recognised text the query covers, 0..1."
    )
    caption: str | None
    filename: str | None = Field(None, description="File name of an indexed file (None for uploads and texts).")
    path: str | None = Field(None, description="Path relative to the folder that was indexed, when known.")
    tags: list[str]
    image_url: str | None = Field(description="None for text items.")
    thumbnail_url: str | None
    width: int | None
    height: int | None
    taken_at: datetime | None = Field(None, description="When the photo was taken (UTC); None for texts.")
    taken_at_source: Literal["exif", "mtime", "upload"] | None = Field(
        None,
        description="exif: DateTimeOriginal; mtime: the file's modification time (no EXIF date); "
        "upload: the upload time (no EXIF date). None for texts and files not yet re-read after an upgrade.",
    )
    matched_text: MatchedText | None = Field(
        None, description="Modes text and hybrid: where the query is in the photo's recognised text; None otherwise."
    )


class SearchResponse(BaseModel):
    results: list[SearchResult]
    collection: str
    total: int = Field(description="Results above min_score among the candidates (see total_exact).")
    total_exact: bool = Field(
        description="False when more items pass than the candidates hold: total is then a lower bound."
    )
    offset: int
    has_more: bool = Field(description="Another page follows (ask again with next_offset).")
    next_offset: int | None = Field(description="offset of the next page; None on the last one.")
    below_cutoff: int = Field(
        description="How many candidates (the nearest items, at most 1000) fell below min_score and were left out."
    )
    min_score: float | None
    sort: SortOrder
    mode: SearchMode = Field("clip", description="How the query was answered (see TextSearchRequest.mode).")
    timings: dict[str, float] = Field(description="Milliseconds per stage: read, encode, search, db, total.")


class LabelProbability(BaseModel):
    label: str
    probability: float


class EmbedTextRequest(StrictModel):
    texts: list[Query] = Field(min_length=1, max_length=MAX_EMBED_TEXTS)


class EmbedResponse(BaseModel):
    vectors: list[list[float]]
    model: str
    dim: int


class MigrationOut(BaseModel):
    """A model migration in progress (`cnclip migrate`, docs/migrate.md): searches use `model` meanwhile."""

    to_model: str = Field(description="The model the collection is being re-embedded with.")
    covered: int = Field(description="Items that have a vector of the new model already.")
    coverage: float = Field(description="covered / items (1.0 when the collection is empty).")


class CollectionOut(BaseModel):
    name: str
    kind: Literal["images", "texts"]
    items: int
    vectors: int
    model: str = Field(description="The model of the active generation: the one that answers searches.")
    dim: int
    index: str
    default: bool = Field(description="Searches that name no collection of this kind use this one.")
    migration: MigrationOut | None = Field(None, description="A migration to another model in progress, if any.")
    created_at: datetime | None
    degraded: str | None = Field(
        None,
        description="Set when this collection's vector store failed to open, update or search: why, in short. "
        "Its searches answer 503 (collection_unavailable) until it opens again; other collections are served.",
    )
    suggested_min_score: dict[str, float] = Field(
        default_factory=dict,
        description="A starting min_score for this collection's model, per query kind (text, image).",
    )
    ocr: bool = Field(
        False, description="The text in its photos is read when they are added, and searchable (docs/ocr.md)."
    )


class CreateCollectionRequest(StrictModel):
    name: CollectionName
    kind: Literal["images", "texts"]
    index: str | None = Field(
        None, max_length=64, description="FAISS factory string, e.g. Flat or IVF1024,PQ64; default: the server's."
    )
    ocr: bool = Field(
        False,
        description="Read the text in the photos added (an image collection only; kept for uploads, "
        "`cnclip index` runs and watched folders; docs/ocr.md).",
    )


class ItemOut(BaseModel):
    id: int
    collection: str
    kind: Literal["images", "texts"]
    caption: str | None
    filename: str | None = Field(None, description="File name of an indexed file (None for uploads and texts).")
    path: str | None = Field(None, description="Path relative to the folder that was indexed, when known.")
    tags: list[str]
    mime: str | None
    size: int | None
    width: int | None
    height: int | None
    image_url: str | None
    thumbnail_url: str | None
    created_at: datetime | None
    taken_at: datetime | None = Field(None, description="When the photo was taken (UTC); see SearchResult.")
    taken_at_source: Literal["exif", "mtime", "upload"] | None = None
    ocr_text: str | None = Field(
        None,
        description="The text recognised in the photo, lines joined by newlines (collections with ocr); "
        "'' when read and none found, None when not read.",
    )


class AddedItem(BaseModel):
    id: int
    created: bool = Field(description="False when an identical item already existed.")


class TextIn(StrictModel):
    text: Query
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)


class AddTextsRequest(StrictModel):
    # The largest legal request: every text and tag at its longest, every character escaped.
    max_body_bytes: ClassVar[int] = (
        MAX_TEXTS_PER_REQUEST * (MAX_QUERY_CHARS + MAX_TAGS * MAX_TAG_CHARS + 64) * _JSON_BYTES_PER_CHAR
    )
    max_json_values: ClassVar[int] = MAX_TEXTS_PER_REQUEST * (MAX_TAGS + 4)

    texts: list[TextIn | Query] = Field(min_length=1, max_length=MAX_TEXTS_PER_REQUEST)

    def normalised(self) -> list[TextIn]:
        return [t if isinstance(t, TextIn) else TextIn(text=t) for t in self.texts]


class AddedItems(BaseModel):
    items: list[AddedItem]


class Deleted(BaseModel):
    deleted: int


class LabelSet(StrictModel):
    labels: list[Label] = Field(min_length=1, max_length=MAX_LABELS, description="Repeated labels are kept once.")
    templates: list[Template] | None = Field(None, max_length=MAX_TEMPLATES)

    @field_validator("labels")
    @classmethod
    def _labels_once(cls, value: list[str]) -> list[str]:
        # After stripping, "猫" and "猫 " are one label; a repeat adds nothing, so it is dropped, not refused.
        return list(dict.fromkeys(value))

    @field_validator("templates")
    @classmethod
    def _templates_are_usable(cls, value: list[str] | None) -> list[str] | None:
        # The same rule as classifying (retrieval/prompts.py), so a saved set is always usable.
        problem = next((p for p in map(template_problem, value or []) if p is not None), None)
        if problem is not None:
            raise ValueError(problem)
        return value


class NamedLabelSet(LabelSet):
    name: str


class Health(BaseModel):
    status: str
