"""The collection service's model-generation use cases (`cnclip migrate`, docs/migrate.md): which
encoder answers a collection (the one of its active model, among the models this process holds),
a migration's status, the migration job itself, the swap, the rollback and the dropping of old or
abandoned generations. Mixed into `CollectionService`, the one door to storage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from indexer.errors import GenerationMoved, MigrationRefused
from indexer.generations import PREVIOUS, SHADOW, Generation, MigrationStatus, other_shadow
from indexer.migration import MigrateOptions, MigrateReport, MigrationJob, MigrationProgress
from indexer.names import check_collection_name
from retrieval.errors import EncoderUnavailable, InvalidInput
from retrieval.manifest import same_model
from retrieval.types import Encoder

if TYPE_CHECKING:
    from indexer.service import DeleteReason
    from indexer.types import Catalog, CollectionInfo, CollectionKind, CollectionState


class _Service(Protocol):
    catalog: Catalog
    encoder: Encoder | None
    encoders: dict[str, Encoder]

    def delete_items(self, item_ids: Sequence[int], *, reason: DeleteReason = ...) -> int: ...

    def encoder_for(self, info: CollectionInfo | CollectionState) -> Encoder: ...

    def check_migration(self, name: str, encoder: Encoder) -> CollectionState: ...

    @staticmethod
    def check_kind(info: CollectionState, kind: CollectionKind, action: str) -> None: ...


class MigrationCases:
    """Mixed into `CollectionService` (indexer/service.py)."""

    encoders: dict[str, Encoder]

    def encoder_for(self: _Service, info: CollectionInfo | CollectionState) -> Encoder:
        """The encoder of the collection's active model (the settings' model or one of
        `CNCLIP_MODEL_DIRS`): a collection embedded by a model this process does not run can be
        neither searched nor added to (its vectors and ours are not comparable)."""
        held = ([self.encoder] if self.encoder is not None else []) + list(self.encoders.values())
        if not held:
            raise EncoderUnavailable("this process runs no model: it cannot embed, search or add")
        for encoder in held:
            if encoder.dim == info.dim and same_model(info.model, encoder.model_id):
                return encoder
        runs = ", ".join(f"{e.model_id} ({e.dim}-d)" for e in held)
        raise InvalidInput(
            f"collection {info.name!r} was indexed with {info.model} ({info.dim}-d vectors); "
            f"the server runs {runs}. Re-index it with this model, or add its model to CNCLIP_MODEL_DIRS."
        )

    def check_generation(self: _Service, target: CollectionState, vector_key: str | None) -> CollectionState:
        """`target`, unless vectors made for another generation are about to be added to it (a swap since
        they were embedded): `GenerationMoved`. Vectors without a key are the default encoder's."""
        if vector_key is not None and vector_key != target.vector_key:
            raise GenerationMoved(f"collection {target.name!r} swapped its model generation; embed again")
        if vector_key is None and self.encoder is not None and self.encoder_for(target) is not self.encoder:
            raise GenerationMoved(f"collection {target.name!r} is answered by {target.model}, not this model")
        return target

    def stored_vector(self: _Service, collection: str, item_id: int) -> tuple[CollectionState, np.ndarray]:
        """The collection and the item's stored vector of its active generation: read between two reads
        of the collection that agree, so a swap (one transaction: vectors and key) cannot fall between."""
        for _attempt in range(3):
            target = self.catalog.collection(collection)
            vector = self.catalog.vector(item_id)
            if self.catalog.collection(collection).vector_key == target.vector_key:
                return target, vector
        raise GenerationMoved(f"collection {collection!r} keeps swapping its model generation; retry")

    def migrations(self: _Service) -> dict[int, tuple[str, int]]:
        """collection id -> (the model it migrates to, items its shadow covers), for the collections API."""
        return self.catalog.migrations()

    def migration_status(self: _Service, name: str) -> MigrationStatus:
        """The collection's generations and how far the shadow (if any) covers its items."""
        return self.catalog.generation_status(check_collection_name(name))

    async def migrate(
        self: _Service,
        name: str,
        encoder: Encoder,
        options: MigrateOptions,
        on_progress: MigrationProgress | None = None,
    ) -> MigrateReport:
        """Re-embed the collection with `encoder`'s model into its shadow generation, then (unless
        `options.swap` is off) probe and swap; searches keep using the active generation meanwhile."""
        state = self.check_migration(name, encoder)
        if not encoder.ready:
            await encoder.start()

        def prune(ids: list[int]) -> int:
            return self.delete_items(ids, reason="pruned")

        return await MigrationJob(self.catalog, prune, encoder, state.name, options, on_progress).run()

    def check_migration(self: _Service, name: str, encoder: Encoder) -> CollectionState:
        """The collection, if it can migrate to `encoder`'s model (before any progress is shown): not its
        model already, an index the new dimension can use, no migration to another model under way."""
        state = self.catalog.collection(check_collection_name(name))
        if same_model(state.model, encoder.model_id) and state.dim == encoder.dim:
            raise InvalidInput(f"collection {state.name!r} is embedded with {state.model} already")
        self.catalog.check_shadow(state.name, encoder.model_id, encoder.dim)
        shadow = self.catalog.generation_status(state.name).shadow
        if shadow is not None and (shadow.model, shadow.dim) != (encoder.model_id, encoder.dim):
            raise MigrationRefused(other_shadow(state.name, shadow.model))
        return state

    def swap(self: _Service, name: str) -> CollectionState:
        """`--swap`: the shadow becomes active (refused until it covers every item)."""
        return self.catalog.swap_generation(check_collection_name(name), SHADOW)

    def rollback(self: _Service, name: str) -> CollectionState:
        """`--rollback`: the previous generation becomes active again (refused when items added since
        the swap have no vector of it: migrate to that model again instead, which reuses its vectors)."""
        return self.catalog.swap_generation(check_collection_name(name), PREVIOUS)

    def drop_generation(self: _Service, name: str, role: str) -> Generation:
        """`--drop-old` (previous) or `--drop-shadow` (an abandoned migration): SQL rows and engine data."""
        return self.catalog.drop_generation(check_collection_name(name), role)
