"""Storage v2: case-insensitive collection names, change versions for many processes, remembered
deletions, the indexed root of each file.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ItemId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _name_keys(connection: sa.Connection) -> dict[int, tuple[str, str]]:
    """id -> (name, key); a name that clashes case-insensitively with an older one is renamed
    `<name>-<id>` (the older keeps its name), since the new unique key could not hold both."""
    rows = connection.execute(sa.text("SELECT id, name FROM collections ORDER BY id")).all()
    taken: set[str] = set()
    result: dict[int, tuple[str, str]] = {}
    for collection_id, name in rows:
        key = name.casefold()
        if key in taken:
            name = f"{name[:50]}-{collection_id}"
            key = name.casefold()
        taken.add(key)
        result[collection_id] = (name, key)
    return result


def upgrade() -> None:
    with op.batch_alter_table("collections") as batch:
        batch.add_column(sa.Column("name_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("vector_key", sa.String(32), nullable=True))
    connection = op.get_bind()
    for collection_id, (name, key) in _name_keys(connection).items():
        connection.execute(
            sa.text("UPDATE collections SET name = :name, name_key = :key, vector_key = :vkey WHERE id = :id"),
            {"name": name, "key": key, "vkey": uuid.uuid4().hex, "id": collection_id},
        )
    # SQLite copies the table here (indexer/storage/sql/db.py turns foreign keys off meanwhile, so the copy's DROP
    # cascades to nothing); the copy gains AUTOINCREMENT: ids of deleted collections are never reused.
    sqlite = connection.dialect.name == "sqlite"
    with op.batch_alter_table(
        "collections", recreate="always" if sqlite else "auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.alter_column("name_key", existing_type=sa.String(200), nullable=False)
        batch.alter_column("vector_key", existing_type=sa.String(32), nullable=False)
        batch.alter_column("version", existing_type=sa.BigInteger(), server_default=None)
        batch.create_unique_constraint("uq_collections_name_key", ["name_key"])
    # Plain ADD COLUMN: a batch (copy) of `items` on SQLite would drop its AUTOINCREMENT, and ids
    # must never be reused. The server default stays (rows written before this revision are version 0).
    op.add_column("items", sa.Column("root", sa.Text(), nullable=True))
    op.add_column("items", sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_index("ix_items_collection_version", "items", ["collection_id", "version"])
    op.create_table(
        "deleted_items",
        sa.Column("id", ItemId, primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("item_id", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("remembered", sa.Boolean(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("deleted_at", sa.DateTime(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_deleted_items_collection_version", "deleted_items", ["collection_id", "version"])
    op.create_index("ix_deleted_items_collection_sha256", "deleted_items", ["collection_id", "sha256"])


def downgrade() -> None:
    op.drop_table("deleted_items")
    op.drop_index("ix_items_collection_version", table_name="items")
    with op.batch_alter_table("items", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("version")
        batch.drop_column("root")
    with op.batch_alter_table("collections") as batch:
        batch.drop_constraint("uq_collections_name_key", type_="unique")
        batch.drop_column("vector_key")
        batch.drop_column("version")
        batch.drop_column("name_key")
