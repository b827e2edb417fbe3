"""What a `cnclip index` run did (and, with `--dry-run`, would do): the counts its summary line and
progress bar show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass
class StageTimes:
    """Seconds a run spent in each stage (docs/indexing.md, "Stage times"). Each is the time the stage
    was busy, summed over its threads: the reader threads and the batches in flight overlap, so the
    stages may add up to more than `wall_s` (and `read_s` alone may, with several reader threads)."""

    walk_s: float = 0.0  # listing the folder or manifest and the stat of each file (the plan)
    read_s: float = 0.0  # reader threads: bytes, sha256, header, perceptual hash (not the decode)
    decode_s: float = 0.0  # reader threads: decode + preprocess to the model's pixels (0: the encoder decodes)
    core_wait_s: float = 0.0  # reader threads waiting for a core to decode on (the encoder's sessions held them)
    encode_s: float = 0.0  # the encoder working on the run's batches (with its own decoding when decode_s is 0)
    commit_s: float = 0.0  # SQL: the rows of each batch committed (with their vectors, for the store to catch up)
    vectors_s: float = 0.0  # the vector store: added and saved at the end of the run
    ocr_s: float = 0.0  # collections with OCR: reading the photos' text
    wall_s: float = 0.0  # the whole run, as the clock on the wall saw it

    def rounded(self) -> dict[str, float]:
        """The stages for `--json`, in milliseconds' precision."""
        return {name: round(seconds, 3) for name, seconds in asdict(self).items()}


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
    hashed: int = 0  # unchanged files without a perceptual hash of this version, hashed now (nothing embedded)
    failures: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    embedded: int = 0  # images that went through the encoder (for items/s)
    read_for_text: int = 0  # images read for text in a collection with OCR (docs/ocr.md)
    stages: StageTimes = field(default_factory=StageTimes)  # where the run's time went

    @property
    def skipped(self) -> int:
        return self.unchanged + self.duplicates + self.not_images + self.deleted_before + self.raw_companions

    @property
    def done(self) -> int:
        return self.added + self.changed + self.renamed + self.skipped + len(self.failures) + self.would_index


ProgressCallback = Callable[[IndexSummary], None]
