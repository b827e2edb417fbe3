"""A collection's model generations as records (`cnclip migrate`, docs/migrate.md): the active one,
at most one `shadow` being filled with the next model and one `previous` kept for a rollback. Their
SQL is indexer/storage/sql/generations.py; the rules are the service's (indexer/service/migration_cases.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

SHADOW, PREVIOUS, ACTIVE = "shadow", "previous", "active"


@dataclass(frozen=True)
class Generation:
    """One generation of a collection's vectors."""

    role: str  # active | shadow | previous
    number: int
    model: str
    dim: int
    vector_key: str
    vectors: int  # items of the collection it has a vector for
    created_at: datetime | None = None
    swapped_at: datetime | None = None  # when it stopped being active (a previous one)
    id: int | None = None  # None for the active one (its row is the collection's)


@dataclass(frozen=True)
class MigrationStatus:
    """Where a collection stands: its items, the active generation and the others."""

    collection: str
    items: int
    active: Generation
    shadow: Generation | None
    previous: Generation | None

    @property
    def missing(self) -> int:
        """Items the shadow still lacks a vector for (0 without a shadow)."""
        return self.items - self.shadow.vectors if self.shadow is not None else 0

    @property
    def coverage(self) -> float:
        """Share of the items the shadow covers (1.0 for an empty collection or without a shadow)."""
        if self.shadow is None or self.items == 0:
            return 1.0
        return self.shadow.vectors / self.items


def other_shadow(name: str, model: str) -> str:
    """Why a migration to another model is refused while one is under way."""
    return (
        f"collection {name!r} is migrating to {model} already; finish it (--swap) or drop it (--drop-shadow) "
        "before migrating to another model"
    )
