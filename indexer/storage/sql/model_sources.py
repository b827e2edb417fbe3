"""Where each model a migration embedded with was loaded from (SQL table `model_sources`, by model id).

`cnclip migrate --model DIR` records DIR under the new model's id (its name and the fingerprint of its
files) before it embeds anything; a server that meets a swap to a model it does not hold reads it back
to load that model (indexer/service/model_loader.py). The directory is a hint, never trusted: the loader checks
that it still holds the model of that id (same files, same fingerprint) before it uses it.
"""

from __future__ import annotations

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from indexer.storage.sql.generations import PREVIOUS, Generation
from indexer.storage.sql.models import GenerationRow, ModelSourceRow, utcnow

MAX_DIRECTORY_CHARS = 4096  # PATH_MAX: a longer value is not a directory a process can open


def record_model_source(engine: Engine, model: str, directory: str) -> None:
    """Remember that `model` was loaded from `directory` (the newest record wins)."""
    if not model or not directory or len(directory) > MAX_DIRECTORY_CHARS or "\x00" in directory:
        return
    for _attempt in range(2):  # two processes recording the same new model: the second updates
        try:
            with Session(engine) as session, session.begin():
                row = session.get(ModelSourceRow, model)
                if row is None:
                    session.add(ModelSourceRow(model=model, directory=directory, recorded_at=utcnow()))
                else:
                    row.directory, row.recorded_at = directory, utcnow()
            return
        except IntegrityError:
            continue


def model_source(engine: Engine, model: str) -> str | None:
    """The directory `model` was last loaded from by a migration, if any was recorded."""
    with Session(engine) as session:
        return session.scalar(select(ModelSourceRow.directory).where(ModelSourceRow.model == model))


def previous_generation(engine: Engine, collection_id: int) -> Generation | None:
    """The collection's previous generation (one indexed read, no counts: `vectors` is 0), if any."""
    with Session(engine) as session:
        row = session.scalar(
            select(GenerationRow).where(GenerationRow.collection_id == collection_id, GenerationRow.role == PREVIOUS)
        )
        if row is None:
            return None
        return Generation(PREVIOUS, row.number, row.model, row.dim, row.vector_key, 0, row.created_at, None, row.id)
