"""When each photo was taken: `items.taken_at` (naive UTC) and `items.taken_source` (exif | mtime |
upload), indexed per collection for date filters and date sorting.

Uploads keep no path to read again, so theirs is their upload time (source `upload`). Files indexed
from folders get NULL here: `cnclip index` of their folder reads their EXIF (or mtime) and fills it
in without embedding anything again (indexer/bulk/pipeline.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch (copy) of `items` on SQLite would drop its AUTOINCREMENT, and ids
    # must never be reused.
    op.add_column("items", sa.Column("taken_at", sa.DateTime(), nullable=True))
    op.add_column("items", sa.Column("taken_source", sa.String(8), nullable=True))
    op.create_index("ix_items_collection_taken", "items", ["collection_id", "taken_at"])
    op.execute(
        "UPDATE items SET taken_at = created_at, taken_source = 'upload' WHERE path IS NULL AND collection_id IN "
        "(SELECT id FROM collections WHERE kind = 'images')"
    )


def downgrade() -> None:
    op.drop_index("ix_items_collection_taken", table_name="items")
    with op.batch_alter_table("items", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("taken_source")
        batch.drop_column("taken_at")
