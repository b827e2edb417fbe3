"""What a `cnclip index` run did (and, with `--dry-run`, would do): the counts its summary line and
progress bar show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class IndexSummary:
    """What a run did; `failures` are (path, reason) of the files it could not index."""

    total: int = 0
    added: int = 0
    changed: int = 0  # files whose bytes changed, re-embedded
    renamed: int = 0  # known bytes at a new path: path updated, nothing embedded
    unchanged: int = 0
    duplicates: int = 0  # same bytes as another file of the collection
    not_images: int = 0  # folder files that are not images at all (not reported as failures)
    raw_companions: int = (
        0  # camera RAWs beside a JPEG/HEIC of the same shot: one photo (indexer/bulk/raw_companions.py)
    )
    deleted_before: int = 0  # bytes a user deleted from the collection: not added again
    pruned: int = 0
    would_index: int = 0  # --dry-run: images a real run would embed (read, decoded, hashed, deduplicated like one)
    would_prune: int = 0
    dated: int = 0  # unchanged files indexed before taken_at existed, dated now (nothing embedded)
    would_date: int = 0  # --dry-run: such files
    hashed: int = 0  # unchanged files indexed before perceptual hashes existed, hashed now (nothing embedded)
    failures: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    embedded: int = 0  # images that went through the encoder (for items/s)
    read_for_text: int = 0  # images read for text in a collection with OCR (docs/ocr.md)

    @property
    def skipped(self) -> int:
        return self.unchanged + self.duplicates + self.not_images + self.deleted_before + self.raw_companions

    @property
    def done(self) -> int:
        return self.added + self.changed + self.renamed + self.skipped + len(self.failures) + self.would_index


ProgressCallback = Callable[[IndexSummary], None]
