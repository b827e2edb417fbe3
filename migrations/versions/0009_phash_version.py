"""`items.phash_version`: which definition of the perceptual hash (indexer/domain/perceptual.py
`PHASH_VERSION`) took `items.phash`. Version 2 decodes at full scale, from the decode the encoder's
pixels come from (issue 34); hashes stored before this revision were version 1 (JPEGs decoded at 1/8
scale) and keep NULL here. `cnclip index` of their folder and `cnclip duplicates --hash-missing` take
them again; meanwhile they are compared as they are (docs/duplicates.md "After upgrading").

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, no default: no row is rewritten (NULL is "before version 2").
    op.add_column("items", sa.Column("phash_version", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("items", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("phash_version")
