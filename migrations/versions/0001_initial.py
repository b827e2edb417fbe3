"""Initial schema: collections, items, item_tags, vectors.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ItemId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "collections",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("index_factory", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "items",
        sa.Column("id", ItemId, primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("mime", sa.String(64), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("caption", sa.Text(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("collection_id", "sha256", name="uq_items_collection_sha256"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_items_collection_path", "items", ["collection_id", "path"])
    op.create_index("ix_items_collection_created", "items", ["collection_id", "created_at"])
    op.create_table(
        "item_tags",
        sa.Column("item_id", ItemId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("tag", sa.String(200), primary_key=True),
    )
    op.create_index("ix_item_tags_tag", "item_tags", ["tag"])
    op.create_table(
        "vectors",
        sa.Column("item_id", ItemId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("vectors")
    op.drop_index("ix_item_tags_tag", table_name="item_tags")
    op.drop_table("item_tags")
    op.drop_index("ix_items_collection_created", table_name="items")
    op.drop_index("ix_items_collection_path", table_name="items")
    op.drop_table("items")
    op.drop_table("collections")
