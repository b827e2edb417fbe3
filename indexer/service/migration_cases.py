"""The collection service's model-generation use cases (`cnclip migrate`, docs/migrate.md): which
encoder answers a collection (the one of its active model, among the models this process holds),
a migration's status, the migration job itself, the swap, the rollback and the dropping of old or
abandoned generations. Held by `CollectionService` as `migration`, the one door to storage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from indexer.domain.generations import PREVIOUS, SHADOW, Generation, MigrationStatus, other_shadow
from indexer.domain.names import check_collection_name
from indexer.domain.records import CollectionInfo, CollectionState
from indexer.errors import GenerationMoved, MigrationRefused
from indexer.service.migration import MigrateOptions, MigrateReport, MigrationJob, MigrationProgress
from indexer.service.ports import GenerationStore, ItemLibrary
from retrieval.errors import EncoderUnavailable, InvalidInput
from retrieval.manifest import same_model
from retrieval.types import Encoder

if TYPE_CHECKING:  # the annotation only (the loader calls `model_loaded` back)
    from indexer.service.model_loader import ModelLoader

Prune = Callable[[list[int]], int]  # deletes items as pruned (the service's `delete_items`)
SWAP_RETRIES = 2  # a search or an add that meets a model generation swap embeds again with the new model


class MigrationCases:
    """Held by `CollectionService` (indexer/service/collections.py) as `migration`, over the items of
    `library` and the generations of `generations`. `encoder`: the default encoder of this process
    (None: it embeds nothing); `encoders`: the other models it holds; `prune` deletes items as pruned."""

    def __init__(
        self,
        library: ItemLibrary,
        generations: GenerationStore,
        encoder: Encoder | None,
        encoders: Sequence[Encoder],
        prune: Prune,
    ) -> None:
        self.library = library
        self.generations = generations
        self.encoder = encoder
        self.encoders = {e.model_id: e for e in encoders if e is not encoder}
        self.prune = prune
        self.model_loader: ModelLoader | None = None  # a server's (indexer/runtime.py): loads swapped-to models

    def encoder_for(self, info: CollectionInfo | CollectionState) -> Encoder:
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
            # Said to a server's client and to a command alike: it names the settings, not "the server".
            f"the model(s) configured by CNCLIP_MODEL_DIR / CNCLIP_MODEL_DIRS: {runs}. "
            "Re-index it with this model, or add its model to CNCLIP_MODEL_DIRS."
        )

    def answering(self, state: CollectionState, *, search: bool = True) -> CollectionState:
        """The generation of `state` that answers in this process: the active one when this process
        holds its model. Else, when a migration recorded where that model lives, indexer/service/model_loader.py
        loads it, and meanwhile a search (`search`) is answered by the previous generation (its model
        held here) and a write is a 503: searches move to the active generation once its encoder is
        warm and never fail for the swap. Without a recorded directory: refused as before (422: add the
        model to CNCLIP_MODEL_DIRS); with one but no previous generation held here, 503 until loaded."""
        try:
            self.encoder_for(state)
            return state
        except InvalidInput:
            loader = self.model_loader
            load = loader.request(state.model, state.dim) if loader is not None else None
            if load is None:
                raise
        previous = self.generations.previous(state) if search else None
        if previous is not None and self.holds(previous.model, previous.dim):
            return replace(
                state,
                model=previous.model,
                dim=previous.dim,
                vector_key=previous.vector_key,
                generation=previous.number,
            )
        doing = "is loading" if load == "loading" else "could not load yet (its log says why; it tries again)"
        raise EncoderUnavailable(f"collection {state.name!r} moved to {state.model}, which this server {doing}")

    def holds(self, model: str, dim: int) -> bool:
        """Whether this process runs an encoder of `model` (`dim`-d)."""
        held = ([self.encoder] if self.encoder is not None else []) + list(self.encoders.values())
        return any(e.dim == dim and same_model(model, e.model_id) for e in held)

    def model_loaded(self, encoder: Encoder) -> None:
        """A model a collection swapped to is warm (indexer/service/model_loader.py): it answers from now on,
        and the previous generations' stores searched meanwhile are released."""
        self.encoders = {**self.encoders, encoder.model_id: encoder}  # a new dict: searches iterate the old one
        self.generations.release_older()

    def check_generation(self, target: CollectionState, vector_key: str | None) -> CollectionState:
        """`target`, unless vectors made for another generation are about to be added to it (a swap since
        they were embedded): `GenerationMoved`. Vectors without a key are the default encoder's."""
        if vector_key is not None and vector_key != target.vector_key:
            raise GenerationMoved(f"collection {target.name!r} swapped its model generation; embed again")
        if vector_key is None and self.encoder is not None and self.encoder_for(target) is not self.encoder:
            raise GenerationMoved(f"collection {target.name!r} is answered by {target.model}, not this model")
        return target

    def stored_vector(self, collection: str, item_id: int) -> tuple[CollectionState, np.ndarray]:
        """The collection and the item's stored vector of its active generation: read between two reads
        of the collection that agree, so a swap (one transaction: vectors and key) cannot fall between."""
        for _attempt in range(3):
            target = self.library.collection(collection)
            vector = self.library.vector(item_id)
            if self.library.collection(collection).vector_key == target.vector_key:
                return target, vector
        raise GenerationMoved(f"collection {collection!r} keeps swapping its model generation; retry")

    def in_progress(self) -> dict[int, tuple[str, int]]:
        """collection id -> (the model it migrates to, items its shadow covers), for the collections API."""
        return self.generations.shadows()

    def status(self, name: str) -> MigrationStatus:
        """The collection's generations and how far the shadow (if any) covers its items."""
        return self.generations.status(check_collection_name(name))

    async def migrate(
        self,
        name: str,
        encoder: Encoder,
        options: MigrateOptions,
        on_progress: MigrationProgress | None = None,
        model_dir: str | None = None,
    ) -> MigrateReport:
        """Re-embed the collection with `encoder`'s model into its shadow generation, then (unless
        `options.swap` is off) probe and swap; searches keep using the active generation meanwhile.
        `model_dir` (an absolute path: where `encoder`'s model was loaded from) is recorded under its
        model id, so that a running server meeting the swap can load that model (indexer/service/model_loader.py)."""
        state = self.check_migration(name, encoder)
        if model_dir is not None:
            self.generations.record_model_source(encoder.model_id, model_dir)
        if not encoder.ready:
            await encoder.start()

        job = MigrationJob(self.library, self.generations, self.prune, encoder, state.name, options, on_progress)
        return await job.run()

    def check_migration(self, name: str, encoder: Encoder) -> CollectionState:
        """The collection, if it can migrate to `encoder`'s model (before any progress is shown): not its
        model already, an index the new dimension can use, no migration to another model under way."""
        state = self.library.collection(check_collection_name(name))
        if same_model(state.model, encoder.model_id) and state.dim == encoder.dim:
            raise InvalidInput(f"collection {state.name!r} is embedded with {state.model} already")
        self.generations.check_shadow(state.name, encoder.model_id, encoder.dim)
        shadow = self.generations.status(state.name).shadow
        if shadow is not None and (shadow.model, shadow.dim) != (encoder.model_id, encoder.dim):
            raise MigrationRefused(other_shadow(state.name, shadow.model))
        return state

    def swap(self, name: str) -> CollectionState:
        """`--swap`: the shadow becomes active (refused until it covers every item)."""
        return self.generations.swap(check_collection_name(name), SHADOW)

    def rollback(self, name: str) -> CollectionState:
        """`--rollback`: the previous generation becomes active again (refused when items added since
        the swap have no vector of it: migrate to that model again instead, which reuses its vectors)."""
        return self.generations.swap(check_collection_name(name), PREVIOUS)

    def drop_generation(self, name: str, role: str) -> Generation:
        """`--drop-old` (previous) or `--drop-shadow` (an abandoned migration): SQL rows and engine data."""
        return self.generations.drop(check_collection_name(name), role)
