"""Near-duplicate groups: `items.phash` (a 64-bit perceptual hash, indexer/domain/perceptual.py) and
`item_copies` (other files with the bytes of an item of the same collection, indexer/copies.py).

Existing images get NULL: `cnclip index` of their folder hashes them without embedding anything
again, and `GET /v1/collections/{name}/duplicates` says how many still lack one.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ItemId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Plain ADD COLUMN: a batch (copy) of `items` on SQLite would drop its AUTOINCREMENT.
    op.add_column("items", sa.Column("phash", sa.BigInteger(), nullable=True))
    op.create_table(
        "item_copies",
        sa.Column("id", ItemId, primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("root", sa.Text(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("mtime", sa.Float(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("collection_id", "path", name="uq_item_copies_collection_path"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_item_copies_collection_sha256", "item_copies", ["collection_id", "sha256"])


def downgrade() -> None:
    op.drop_table("item_copies")
    with op.batch_alter_table("items", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("phash")
