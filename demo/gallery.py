"""`cnclip demo`'s data: a gallery of generated pictures and a text collection, indexed for real.

Layout under `<data_dir>/demo/`:

    images/demo-0000.png …   the pictures (224×224 PNG)
    gallery.jsonl            the bulk indexer's manifest: path, caption, tags, extra.attributes
    texts.jsonl              captions and tags for image → text search

The manifest is written last, so its presence means the files are complete; a second run reuses
them, and the indexer skips every picture it already has (size and mtime unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from api.config import Settings
from demo import dataset, vocabulary

if TYPE_CHECKING:
    from indexer.domain.index_summary import IndexSummary
    from indexer.service.collections import CollectionService

IMAGE_COLLECTION = "demo"
TEXT_COLLECTION = "demo-texts"
GALLERY_SIZE = 300
GALLERY_SEED = 7


@dataclass(frozen=True)
class DemoFiles:
    root: Path
    manifest: Path
    texts: Path
    created: bool  # False when an earlier run's files were reused


def describe(attrs: vocabulary.Attributes) -> str:
    """A caption naming every attribute: "一个大的红色星形在左边，绿色条纹背景"."""
    what = f"{vocabulary.COUNT_WORDS[attrs.count]}个{attrs.size}的{attrs.colour}{attrs.shape}"
    where = f"在{attrs.position}" if attrs.position else ""
    return f"{what}{where}，{attrs.background}{attrs.texture}背景"


def demo_texts(gallery: list[dataset.Sample], seed: int = GALLERY_SEED) -> list[dict]:
    """Unique captions (full descriptions, held-out-template sentences) and tags of the gallery's
    pictures, as `index-texts` JSONL rows; `extra.named` holds the attributes each text names."""
    rng = random.Random(f"demo-texts:{seed}")
    texts: dict[str, dict] = {}

    def add(caption: dataset.Caption, kind: str) -> None:
        texts.setdefault(caption.text, {"text": caption.text, "tags": [kind], "extra": {"named": caption.named}})

    for s in gallery:
        a = s.attributes
        add(dataset.Caption(describe(a), {k: v for k, v in asdict(a).items()}), "描述")
        for template in rng.sample(dataset.usable(dataset.HELDOUT_TEMPLATES, a), 2):
            add(dataset.fill(template, a, rng), "句子")
        for tag in dataset.tag_captions(a):
            add(tag, "标签")
    return list(texts.values())


def write_demo_files(settings: Settings, n: int = GALLERY_SIZE, seed: int = GALLERY_SEED) -> DemoFiles:
    """Draw the gallery and write both manifests under `<data_dir>/demo`, unless already there."""
    root = settings.data_dir / "demo"
    manifest = root / "gallery.jsonl"
    texts = root / "texts.jsonl"
    if manifest.is_file() and texts.is_file():
        return DemoFiles(root, manifest, texts, created=False)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    gallery = dataset.demo_gallery(n, seed)
    rows = []
    for i, s in enumerate(gallery):
        name = f"demo-{i:04d}.png"
        s.image().save(images / name, format="PNG", optimize=False)
        a = s.attributes
        rows.append(
            {
                "path": f"images/{name}",
                "caption": describe(a),
                "tags": dataset.tags(a),
                "extra": {"attributes": asdict(a)},
            }
        )
    lines = [json.dumps(t, ensure_ascii=False) + "\n" for t in demo_texts(gallery, seed)]
    texts.write_text("".join(lines), encoding="utf-8")
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(manifest)
    return DemoFiles(root, manifest, texts, created=True)


def _drop_other_models(service: CollectionService, model_id: str) -> list[str]:
    """Delete the demo collections that an earlier model embedded (the data is regenerated, not the user's)."""
    dropped = []
    for info, _default in service.list_all():
        if info.name in (IMAGE_COLLECTION, TEXT_COLLECTION) and info.model != model_id:
            service.delete_collection(info.name)
            dropped.append(f"{info.name} (embedded with {info.model})")
    return dropped


@dataclass(frozen=True)
class DemoIndexResult:
    replaced: list[str]  # demo collections deleted because another model had embedded them
    images_added: int
    images_skipped: int
    failures: int
    texts_added: int
    texts_existing: int


class ProgressBar(Protocol):
    """What shows the gallery's indexing (cli/progress.py `IndexProgress`, on stderr)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...

    def update(self, summary: IndexSummary) -> None: ...


async def index_demo(settings: Settings, files: DemoFiles, progress: ProgressBar | None = None) -> DemoIndexResult:
    """Index the gallery with the bulk indexer (with `progress` shown) and the texts into their collection."""
    from indexer.bulk.pipeline import ImageIndexer
    from indexer.bulk.texts import index_texts, read_texts
    from indexer.runtime import open_runtime

    async with open_runtime(settings, stores="now", warm=False) as rt:
        assert rt.service is not None
        replaced = await asyncio.to_thread(_drop_other_models, rt.service, rt.encoder.model_id)
        await rt.start_encoders()
        indexer = ImageIndexer.from_settings(settings, rt.service, IMAGE_COLLECTION)
        with progress or contextlib.nullcontext():
            summary = await indexer.run(files.manifest, on_progress=progress.update if progress is not None else None)
        texts = read_texts(files.texts)
        added, existing = await index_texts(rt.service, TEXT_COLLECTION, texts, batch_size=max(settings.buckets))
    return DemoIndexResult(
        replaced=replaced,
        images_added=summary.added + summary.changed,
        images_skipped=summary.skipped + summary.renamed,
        failures=len(summary.failures),
        texts_added=added,
        texts_existing=existing,
    )


def example_commands(settings: Settings, files: DemoFiles) -> list[tuple[str, str]]:
    """(what, shell command) pairs that work against the demo server."""
    base = f"http://{settings.host}:{settings.port}"
    picture = files.root / "images" / "demo-0000.png"
    query = json.dumps({"query": "红色的星星", "k": 5, "collection": IMAGE_COLLECTION}, ensure_ascii=False)
    return [
        ("web UI: open in a browser", f"{base}/"),
        ("text → image", f"curl -s {base}/v1/search/text -H 'Content-Type: application/json' -d '{query}'"),
        (
            "image → image",
            f"curl -s {base}/v1/search/image -F file=@{picture} -F k=5 -F collection={IMAGE_COLLECTION}",
        ),
        (
            "image → text",
            f"curl -s {base}/v1/search/image -F file=@{picture} -F k=5 -F target=texts -F collection={TEXT_COLLECTION}",
        ),
        (
            "zero-shot",
            f'curl -s {base}/v1/classify -F file=@{picture} -F \'labels=["圆形","正方形","三角形","星形","心形"]\'',
        ),
    ]
