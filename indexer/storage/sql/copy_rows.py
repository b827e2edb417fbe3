"""Forgetting copies (indexer/storage/sql/duplicate_rows.py) inside the transactions that make them stale: a path
that becomes an item's, the bytes of a deleted item. Apart from duplicate_rows.py so that rows.py can
call it without an import cycle."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete
from sqlalchemy.orm import Session

from indexer.domain.values import chunks
from indexer.storage.sql.models import ItemCopyRow


def forget_copy_paths(session: Session, collection_id: int, paths: Sequence[str]) -> None:
    """These paths are items now (new bytes, or an item moved there): they are no copies any more."""
    for part in chunks(sorted(set(paths))):
        session.execute(
            delete(ItemCopyRow).where(ItemCopyRow.collection_id == collection_id, ItemCopyRow.path.in_(part))
        )


def forget_copies_of(session: Session, collection_id: int, shas: Sequence[str]) -> None:
    """The items with these bytes are deleted: their copies go with them."""
    for part in chunks(sorted(set(shas))):
        session.execute(
            delete(ItemCopyRow).where(ItemCopyRow.collection_id == collection_id, ItemCopyRow.sha256.in_(part))
        )
