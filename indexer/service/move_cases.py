"""The collection service's moves by content (what they are: indexer/bulk/moves.py): write one pass's
moves, and tell the pass where some bytes are now. Held by `CollectionService` as `moves`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from indexer.domain.duplicates import FileCopy
from indexer.domain.names import check_collection_name
from indexer.domain.records import CollectionKind, CollectionState, FileMoves, FileState
from indexer.service.ports import CollectionStore, ItemStore, MoveStore
from indexer.service.thumbnails import thumbnail_path

Writable = Callable[[str, CollectionKind], CollectionState]  # indexer/service/resolver.py `CollectionResolver.writable`


class MoveCases:
    """Over `collections` and `items` (the collection rows, the replaced items' records) and `store`
    (the moves' SQL). `writable` checks a collection before it is written; a replaced item's cached
    thumbnail under `thumbs_dir` goes with it."""

    def __init__(
        self,
        collections: CollectionStore,
        items: ItemStore,
        store: MoveStore,
        writable: Writable,
        thumbs_dir: Path | None,
    ) -> None:
        self.collections = collections
        self.items = items
        self.store = store
        self.writable = writable
        self.thumbs_dir = thumbs_dir

    def move_files(self, name: str, moves: FileMoves) -> None:
        """Write one pass's moves by content in one transaction; a replaced item's cached thumbnail
        goes with it."""
        target = self.writable(name, "images")
        gone = self.items.get_many(moves.replaced) if moves.replaced and self.thumbs_dir is not None else []
        self.store.move_files(target.id, moves)
        for item in gone:  # after the commit: a cache file that will not go never undoes the moves
            if item.sha256 and self.thumbs_dir is not None:
                with contextlib.suppress(OSError):  # served by item id only, and the item is gone
                    thumbnail_path(self.thumbs_dir, item.sha256).unlink(missing_ok=True)

    def copies_of(self, name: str, shas: Sequence[str]) -> dict[str, list[FileCopy]]:
        """sha256 -> the recorded copies of those bytes (where a displaced item's bytes may be)."""
        return self.store.copies_of(self.collections.collection(check_collection_name(name)).id, shas)

    def files_with(self, name: str, shas: Sequence[str]) -> dict[str, tuple[str, FileState]]:
        """sha256 -> (path, state) of the indexed files with these bytes (where their items are)."""
        return self.store.files_with(self.collections.collection(check_collection_name(name)).id, shas)
