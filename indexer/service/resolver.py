"""Which collection a request means: the named one or the default of its kind, checked for kind and
model before any model work (an unknown collection is a 404 at once). Read from SQL alone: no vector
store is opened, so a process that only writes (`cnclip index`) never needs the engine until its
final flush. Held by `CollectionService` (indexer/service/collections.py) as `resolver`; the search
and write features take it."""

from __future__ import annotations

import time

from indexer.domain.names import check_collection_name
from indexer.domain.records import CollectionInfo, CollectionKind, CollectionState
from indexer.service.migration_cases import MigrationCases
from indexer.service.ports import CollectionStore
from retrieval.errors import InvalidInput, NotFound

_NOUNS = {"images": "image", "texts": "text"}


def check_kind(info: CollectionInfo | CollectionState, kind: CollectionKind, action: str) -> None:
    """Adding to or searching the wrong kind of collection says which kind it is (a 422)."""
    if info.kind != kind:
        raise InvalidInput(f"collection {info.name!r} holds {info.kind}; {action} needs an {_NOUNS[kind]} collection")


class CollectionResolver:
    """Over the collection rows of `collections`; `migration` says which generation answers (its
    `answering`). The default collection's name is looked up at most every `default_ttl_s`."""

    def __init__(self, collections: CollectionStore, migration: MigrationCases, default_ttl_s: float) -> None:
        self.collections = collections
        self.migration = migration
        self.default_ttl_s = default_ttl_s
        self._defaults: dict[str, tuple[float, str]] = {}  # kind -> (when looked up, name)

    def resolve(
        self, name: str | None, kind: CollectionKind, action: str = "this search", *, answer: bool = False
    ) -> CollectionState:
        """The named collection (404 when unknown) or the default of `kind` (the oldest), checked
        for kind and model (indexer/service/migration_cases.py `answering`: with `answer`, a search, the
        generation this process answers with). SQL only: no vector store is opened."""
        state = self._default(kind) if name is None else self.collections.collection(check_collection_name(name))
        check_kind(state, kind, action)
        return self.migration.answering(state, search=answer)

    def writable(self, name: str | CollectionState, kind: CollectionKind) -> CollectionState:
        """The collection `name` checked before anything is embedded for it (a state it returned: as is)."""
        return name if isinstance(name, CollectionState) else self.resolve(name, kind, "adding " + kind)

    def forget_defaults(self, kind: CollectionKind | None = None) -> None:
        """Look the default of `kind` (None: of each kind) up again: a collection was created or
        deleted, and the oldest may differ."""
        if kind is None:
            self._defaults.clear()
        else:
            self._defaults.pop(kind, None)

    def _default(self, kind: CollectionKind) -> CollectionState:
        """The oldest collection of `kind` (its name looked up at most every `default_ttl_s`): one read."""
        cached = self._defaults.get(kind)
        if cached is not None and time.monotonic() - cached[0] < self.default_ttl_s:
            return self.collections.collection(cached[1])
        state = next((s for s in self.collections.collections() if s.kind == kind), None)
        if state is None:
            raise NotFound(f"there is no {_NOUNS[kind]} collection yet; add one (cnclip index ...) or name one")
        self._defaults[kind] = (time.monotonic(), state.name)
        return state
