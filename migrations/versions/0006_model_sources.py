"""Model sources: the directory `cnclip migrate --model DIR` loaded each model from, by model id, so that
a server meeting a swap to a model it does not hold can load it (indexer/service/model_loader.py) instead of
refusing the collection's searches until it restarts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_sources",
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("directory", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_sources")
