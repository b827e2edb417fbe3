"""What each file a bulk run read needs (indexer/bulk/pipeline.py): new bytes go to the encoder; bytes the
collection has already become a path or date update (a touch, a rename) or nothing (a duplicate);
bytes a user deleted stay deleted. The dry run routes its files the same way, so it counts exactly
what a real run would embed."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from indexer.bulk.reading import PreparedFile
from indexer.domain.duplicates import FileCopy
from indexer.domain.index_summary import IndexSummary
from indexer.domain.records import TakenSource
from indexer.fs.presence import file_gone

# (path updates (id, path, size, mtime), date updates (id, taken_at, source), ids to delete)
MovePayload = tuple[list[tuple[int, str, int, float]], list[tuple[int, datetime, TakenSource]], list[int]]


class FileRouter:
    """Routes the files of one run against what the collection holds (read once, at the start)."""

    def __init__(
        self, contents: dict[str, tuple[int, str | None]], deleted: set[str], copies: list[FileCopy] | None = None
    ) -> None:
        self.contents = contents  # sha256 -> (item id, path), updated as renames are found
        self.deleted = deleted  # sha256 of the items a user deleted
        self.pending: set[str] = set()  # sha256 of the files of this run sent to the encoder
        # Files with the bytes of an item at another path (the identical tier of `cnclip duplicates`).
        self.copies = copies if copies is not None else []
        self.hashing: set[str] = set()  # sha256 the readers were asked to hash (the first file of each)

    def needs_hash(self, sha256: str) -> bool:
        """Whether the reader takes a file's perceptual hash (reader threads): only the first file of
        bytes the collection does not have (they will be embedded); a rename or a copy costs no decoding.
        Two readers racing on one sha may both hash it: harmless."""
        if sha256 in self.contents or sha256 in self.hashing:
            return False
        self.hashing.add(sha256)
        return True

    def route(self, prepared: PreparedFile, summary: IndexSummary) -> Literal["embed"] | MovePayload | None:
        """ "embed" (new bytes), a path/date update for bytes the collection has, or nothing (deleted
        by a user earlier). Counts the file in `summary`."""
        if prepared.sha256 in self.deleted and prepared.replaces is None:
            summary.deleted_before += 1  # a user deleted these bytes: they stay deleted
            return None
        known = self.contents.get(prepared.sha256)
        if known is None and prepared.sha256 not in self.pending:
            self.pending.add(prepared.sha256)
            return "embed"
        return self._known_content(prepared, known, summary)

    def _known_content(
        self, prepared: PreparedFile, known: tuple[int, str | None] | None, summary: IndexSummary
    ) -> MovePayload:
        """Bytes the collection has already: a touched file, a rename, or a duplicate."""
        path = str(prepared.entry.path)
        replaced = [prepared.replaces] if prepared.replaces is not None else []
        if known is None:  # same bytes as a file earlier in this run: it is being embedded now
            summary.duplicates += 1
            self._copy(prepared)
            return [], [], replaced
        item_id, known_path = known
        if known_path == path:
            summary.unchanged += 1  # touched, same bytes: remember the new mtime only
        elif known_path is None or file_gone(known_path):  # indexer/fs/presence.py
            summary.renamed += 1  # moved over this path's item (`mv b a`): that one is replaced
            self.contents[prepared.sha256] = (item_id, path)
        else:
            summary.duplicates += 1
            self._copy(prepared)
            return [], [], replaced
        # Its date as read now: an mtime date follows the file's mtime, and a row from before 0003 gets one.
        return [(item_id, path, prepared.size, prepared.mtime)], [(item_id, *prepared.taken)], replaced

    def _copy(self, prepared: PreparedFile) -> None:
        root = str(prepared.entry.root) if prepared.entry.root is not None else None
        self.copies.append(FileCopy(prepared.sha256, str(prepared.entry.path), root, prepared.size, prepared.mtime))
