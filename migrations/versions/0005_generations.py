"""Model generations: a collection moves from one model to the next without downtime (`cnclip migrate`,
docs/migrate.md). `collections.generation` numbers the active generation (0 for every collection made
before this revision: its FAISS file keeps its name); `generations` holds the others, at most one
shadow (being filled with the next model) and one previous (kept for `--rollback` until `--drop-old`);
`generation_vectors` their vectors, tagged by model like `vectors`, gone with their item.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ItemId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Plain ADD COLUMN: no copy of `collections`, existing collections are generation 0.
    op.add_column("collections", sa.Column("generation", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "generations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("vector_key", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("swapped_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("collection_id", "role", name="uq_generations_collection_role"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "generation_vectors",
        sa.Column(
            "generation_id", sa.Integer(), sa.ForeignKey("generations.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("item_id", ItemId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_generation_vectors_item", "generation_vectors", ["item_id"])


def downgrade() -> None:
    op.drop_table("generation_vectors")
    op.drop_table("generations")
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table(
        "collections", recreate="always" if sqlite else "auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.drop_column("generation")
