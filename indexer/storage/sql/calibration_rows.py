"""The similar-shots calibration's SQL (indexer/service/duplicate_calibration.py measures it): one row per
collection, the measurement as JSON; and the EXIF dates and item count the measurement reads."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from indexer.domain.duplicates import Calibration
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import DuplicateCalibrationRow, ItemRow


def load_calibration(engine: Engine, collection_id: int) -> Calibration | None:
    """The stored calibration of a collection, or None (none yet, or unreadable: measured again)."""
    with Session(engine) as session:
        row = session.get(DuplicateCalibrationRow, collection_id)
        if row is None:
            return None
        try:
            return Calibration(**json.loads(row.details))
        except (TypeError, ValueError):
            return None


def save_calibration(engine: Engine, collection_id: int, calibration: Calibration) -> None:
    """Replace the collection's calibration (a write: a writer slot first, indexer/storage/sql/lock_order.py)."""
    with writer_slot(engine), Session(engine) as session:
        session.execute(delete(DuplicateCalibrationRow).where(DuplicateCalibrationRow.collection_id == collection_id))
        session.add(
            DuplicateCalibrationRow(
                collection_id=collection_id,
                model=calibration.model,
                generation=calibration.generation,
                item_count=calibration.item_count,
                threshold=calibration.threshold,
                details=json.dumps(asdict(calibration)),
                computed_at=datetime.now(UTC).replace(tzinfo=None),
            )
        )
        session.commit()


def exif_times(engine: Engine, collection_id: int) -> dict[int, float]:
    """Item id -> EXIF date taken (epoch seconds, naive UTC as stored), for items that have one."""
    query = select(ItemRow.id, ItemRow.taken_at).where(
        ItemRow.collection_id == collection_id, ItemRow.taken_source == "exif", ItemRow.taken_at.is_not(None)
    )
    with Session(engine) as session:
        return {int(i): t.replace(tzinfo=UTC).timestamp() for i, t in session.execute(query) if t is not None}


def count_items(engine: Engine, collection_id: int) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).where(ItemRow.collection_id == collection_id)) or 0)
