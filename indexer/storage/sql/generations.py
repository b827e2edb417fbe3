"""Model generations in SQL: a collection's vectors of more than one model while it moves from one to
the next (`cnclip migrate`, docs/migrate.md).

The active generation is the collection's own row (`model`, `dim`, `vector_key`, `generation`) and its
vectors are `vectors`, as before: nothing that reads or writes a collection knows about generations.
The others are `generations` rows with their vectors in `generation_vectors`: at most one `shadow`
(being filled with the next model) and one `previous` (the one a swap replaced, kept for a rollback
until dropped). A vector of either goes with its item (foreign key, ON DELETE CASCADE).

Items added while a shadow fills get vectors of the active model only; the migration embeds whatever
the shadow lacks again and again, and the swap refuses unless the shadow covers every item. The swap
is one transaction that first bumps the collection's version (on PostgreSQL: the collection row's lock,
which every writer takes first too, so no item can slip in between the coverage check and the commit):
the active vectors move to a new `previous` generation, the shadow's become `vectors`, and the
collection's model, dim, vector_key and generation number become the shadow's. Every process reads the
new vector_key with the version (indexer/storage/store_pool.py) and opens the new generation's store: FAISS
files and Milvus collections are per generation, so nothing in use is rewritten.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from sqlalchemy import Engine, Integer, delete, exists, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from indexer.domain.generations import ACTIVE, PREVIOUS, SHADOW, Generation, MigrationStatus, other_shadow
from indexer.domain.records import CollectionState
from indexer.domain.values import aware, chunks, vector_matrix
from indexer.errors import MigrationRefused
from indexer.storage.sql.deletion_rows import bump_version
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import CollectionRow, GenerationRow, GenerationVectorRow, ItemRow, VectorRow, utcnow


def _generation(row: GenerationRow, vectors: int) -> Generation:
    return Generation(
        row.role, row.number, row.model, row.dim, row.vector_key, vectors,
        aware(row.created_at), aware(row.swapped_at), row.id,
    )  # fmt: skip


class GenerationRows:
    """The generations' SQL: synchronous, thread-safe (one session per call)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- reads -------------------------------------------------------------------------------------
    def status(self, state: CollectionState) -> MigrationStatus:
        with Session(self.engine) as session:
            items = int(session.scalar(select(func.count()).where(ItemRow.collection_id == state.id)) or 0)
            others: dict[str, Generation] = {}
            for row in session.scalars(select(GenerationRow).where(GenerationRow.collection_id == state.id)):
                count = select(func.count()).where(GenerationVectorRow.generation_id == row.id)
                others[row.role] = _generation(row, int(session.scalar(count) or 0))
        active = Generation(ACTIVE, state.generation, state.model, state.dim, state.vector_key, items)
        return MigrationStatus(state.name, items, active, others.get(SHADOW), others.get(PREVIOUS))

    def shadows(self) -> dict[int, tuple[str, int]]:
        """collection id -> (the shadow's model, vectors it holds), for every collection migrating now."""
        query = (
            select(GenerationRow.collection_id, GenerationRow.model, func.count(GenerationVectorRow.item_id))
            .outerjoin(GenerationVectorRow, GenerationVectorRow.generation_id == GenerationRow.id)
            .where(GenerationRow.role == SHADOW)
            .group_by(GenerationRow.collection_id, GenerationRow.model)
        )
        with Session(self.engine) as session:
            return {int(cid): (model, int(count)) for cid, model, count in session.execute(query)}

    def generation(self, state: CollectionState, role: str) -> Generation | None:
        return {SHADOW: self.status(state).shadow, PREVIOUS: self.status(state).previous}.get(role)

    def missing_ids(self, collection_id: int, generation_id: int, limit: int, after: int = 0) -> list[int]:
        """Up to `limit` items of the collection with ids above `after` (in id order: a cursor, so a
        fill reads each item once) the generation has no vector for."""
        covered = exists().where(
            GenerationVectorRow.generation_id == generation_id, GenerationVectorRow.item_id == ItemRow.id
        )
        query = (
            select(ItemRow.id)
            .where(ItemRow.collection_id == collection_id, ItemRow.id > after, ~covered)
            .order_by(ItemRow.id)
            .limit(limit)
        )
        with Session(self.engine) as session:
            return [int(i) for i in session.scalars(query)]

    def covered_ids(self, generation_id: int) -> np.ndarray:
        query = select(GenerationVectorRow.item_id).where(GenerationVectorRow.generation_id == generation_id)
        with Session(self.engine) as session:
            return np.sort(np.fromiter(session.scalars(query), dtype=np.int64))

    def vectors(self, generation_id: int, ids: np.ndarray | Sequence[int], dim: int) -> np.ndarray:
        """The generation's vectors of `ids`, in that order (zero rows for ids it lacks)."""
        found: dict[int, bytes] = {}
        with Session(self.engine) as session:
            for part in chunks(ids):
                query = select(GenerationVectorRow.item_id, GenerationVectorRow.vector).where(
                    GenerationVectorRow.generation_id == generation_id, GenerationVectorRow.item_id.in_(part)
                )
                found.update(list(session.execute(query)))
        return vector_matrix(ids, found, dim)

    # --- writes ------------------------------------------------------------------------------------
    def begin_shadow(self, state: CollectionState, model: str, dim: int) -> Generation:
        """The shadow generation for `model` (`dim`-d): the one there is (a resumed run), the previous
        generation when it was this model (its vectors are reused), else a new empty one. A shadow of
        another model is refused: finish or drop that migration first. Two runs starting together
        share one shadow (the unique role per collection makes the second read the first's)."""
        try:
            return self._begin_shadow(state, model, dim)
        except IntegrityError:
            return self._begin_shadow(state, model, dim)

    def _begin_shadow(self, state: CollectionState, model: str, dim: int) -> Generation:
        with Session(self.engine) as session:
            rows = {
                r.role: r for r in session.scalars(select(GenerationRow).where(GenerationRow.collection_id == state.id))
            }
            shadow = rows.get(SHADOW)
            if shadow is not None and (shadow.model != model or shadow.dim != dim):
                raise MigrationRefused(other_shadow(state.name, shadow.model))
            previous = rows.get(PREVIOUS)
            if shadow is None and previous is not None and previous.model == model and previous.dim == dim:
                previous.role, shadow = SHADOW, previous  # back to the model before: its vectors are kept
            if shadow is None:
                numbers = [state.generation, *(r.number for r in rows.values())]
                shadow = GenerationRow(
                    collection_id=state.id, role=SHADOW, number=max(numbers) + 1, model=model, dim=dim,
                    vector_key=uuid.uuid4().hex, created_at=utcnow(),
                )  # fmt: skip
                session.add(shadow)
            session.commit()
            generation_id = shadow.id
        found = self.status(state).shadow
        assert found is not None and found.id == generation_id
        return found

    def put_vectors(self, generation: Generation, ids: Sequence[int], unit: np.ndarray) -> int:
        """Store the generation's (L2-normalised) vectors of `ids`; ids deleted meanwhile and ids it has
        already (another run got there first) are skipped. Returns how many were stored."""
        assert generation.id is not None
        for _attempt in range(3):
            with Session(self.engine) as session:
                alive = set(session.scalars(select(ItemRow.id).where(ItemRow.id.in_([int(i) for i in ids]))))
                held = set(
                    session.scalars(
                        select(GenerationVectorRow.item_id).where(
                            GenerationVectorRow.generation_id == generation.id,
                            GenerationVectorRow.item_id.in_([int(i) for i in ids]),
                        )
                    )
                )
                rows = [
                    {
                        "generation_id": generation.id,
                        "item_id": int(i),
                        "model": generation.model,
                        "vector": v.tobytes(),
                    }
                    for i, v in zip(ids, np.asarray(unit, dtype=np.float32), strict=True)
                    if int(i) in alive and int(i) not in held
                ]
                if not rows:
                    return 0
                try:
                    session.execute(insert(GenerationVectorRow), rows)
                    session.commit()
                    return len(rows)
                except IntegrityError:  # an item deleted, or a row written by another run, just now
                    session.rollback()
                    if session.get(GenerationRow, generation.id) is None:
                        raise MigrationRefused(
                            f"the migration to {generation.model} was swapped in or dropped by another run"
                        ) from None
        return 0

    def swap(self, state: CollectionState, role: str) -> tuple[CollectionState, Generation | None]:
        """Make the `role` generation (shadow or previous) the active one, in one transaction; the active
        one becomes the previous. Returns the collection's new state and the generation dropped to make
        room (an older previous, when a shadow is swapped in), whose engine data the caller drops."""
        with writer_slot(self.engine), Session(self.engine, expire_on_commit=False) as session:
            version = bump_version(session, state.id)  # first: the writers' lock on PostgreSQL
            collection = session.get(CollectionRow, state.id)
            rows = {
                r.role: r for r in session.scalars(select(GenerationRow).where(GenerationRow.collection_id == state.id))
            }
            target = rows.get(role)
            if collection is None or target is None:
                raise MigrationRefused(_nothing_to(role, state.name))
            self._check_coverage(session, collection, target)
            dropped = rows.get(PREVIOUS) if role == SHADOW else None
            outgoing = GenerationRow(
                collection_id=state.id, role="swapping", number=collection.generation, model=collection.model,
                dim=collection.dim, vector_key=collection.vector_key, created_at=utcnow(), swapped_at=utcnow(),
            )  # fmt: skip
            session.add(outgoing)
            session.flush()
            items = select(ItemRow.id).where(ItemRow.collection_id == state.id)
            active = select(
                literal(outgoing.id, Integer), VectorRow.item_id, VectorRow.model,
                VectorRow.vector,
            ).where(VectorRow.item_id.in_(items))  # fmt: skip
            columns = ["generation_id", "item_id", "model", "vector"]
            session.execute(insert(GenerationVectorRow).from_select(columns, active))
            session.execute(delete(VectorRow).where(VectorRow.item_id.in_(items)))
            incoming = select(GenerationVectorRow.item_id, GenerationVectorRow.model, GenerationVectorRow.vector).where(
                GenerationVectorRow.generation_id == target.id
            )
            session.execute(insert(VectorRow).from_select(["item_id", "model", "vector"], incoming))
            dropped_generation = _generation(dropped, 0) if dropped is not None else None
            for gone in (target, dropped):
                if gone is not None:
                    session.execute(delete(GenerationVectorRow).where(GenerationVectorRow.generation_id == gone.id))
                    session.execute(delete(GenerationRow).where(GenerationRow.id == gone.id))
            session.execute(
                update(CollectionRow)
                .where(CollectionRow.id == state.id)
                .values(model=target.model, dim=target.dim, vector_key=target.vector_key, generation=target.number)
            )
            session.execute(update(GenerationRow).where(GenerationRow.id == outgoing.id).values(role=PREVIOUS))
            session.commit()
        fresh = replace(
            state, model=target.model, dim=target.dim, vector_key=target.vector_key, generation=target.number,
            version=version,
        )  # fmt: skip
        return fresh, dropped_generation

    @staticmethod
    def _check_coverage(session: Session, collection: CollectionRow, target: GenerationRow) -> None:
        covered = select(GenerationVectorRow.item_id).where(GenerationVectorRow.generation_id == target.id)
        missing = int(
            session.scalar(
                select(func.count()).where(ItemRow.collection_id == collection.id, ItemRow.id.not_in(covered))
            )
            or 0
        )
        if missing:
            raise MigrationRefused(
                f"collection {collection.name!r}: {missing} items have no {target.model} vector yet; run "
                f"`cnclip migrate --collection {collection.name} --model DIR` to fill them before swapping"
            )

    def drop(self, state: CollectionState, role: str) -> Generation:
        """Forget the `role` generation (previous: `--drop-old`; shadow: `--drop-shadow`) and its vectors;
        returns it (the caller drops its engine data)."""
        found = self.generation(state, role)
        if found is None:
            raise MigrationRefused(_nothing_to(role, state.name))
        with Session(self.engine) as session:
            session.execute(delete(GenerationVectorRow).where(GenerationVectorRow.generation_id == found.id))
            session.execute(delete(GenerationRow).where(GenerationRow.id == found.id))
            session.commit()
        return found

    def all_generations(self, collection_id: int) -> list[Generation]:
        """Every generation but the active one (a collection's deletion drops their engine data)."""
        with Session(self.engine) as session:
            return [
                _generation(r, 0)
                for r in session.scalars(select(GenerationRow).where(GenerationRow.collection_id == collection_id))
            ]


def _nothing_to(role: str, name: str) -> str:
    if role == PREVIOUS:
        return f"collection {name!r} has no previous generation to go back to or drop (none kept, or dropped)"
    return (
        f"collection {name!r} has no migration in progress (start one: cnclip migrate --collection {name} --model DIR)"
    )
