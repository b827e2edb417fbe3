"""Text in photos (issue 32): `collections.ocr` turns recognition on for a collection; `item_texts`
holds each recognised item's text (lines joined by "\\n"), its normal form (indexer/domain/text_grams.py)
and its lines with boxes and confidences; `item_text_grams` every 1-, 2- and 3-character substring of
the normal form, so any part of a Chinese text is found by an index lookup on both databases (no
FTS5 or pg_trgm: those split into trigrams or pairs and miss single characters), with the gram's
occurrences and coverage of the text, the rank of a query that is this gram, in an index of its own.
An item recognised without text has a row with an empty text, so a resumed `cnclip ocr` knows it is
done. Both go with their item.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ItemId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Plain ADD COLUMN: no copy of `collections`, existing collections have OCR off.
    op.add_column("collections", sa.Column("ocr", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "item_texts",
        sa.Column("item_id", ItemId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("normalized", sa.Text(), nullable=False),
        sa.Column("lines", sa.Text(), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_item_texts_collection_item", "item_texts", ["collection_id", "item_id"])
    op.create_table(
        "item_text_grams",
        sa.Column("collection_id", sa.Integer(), sa.ForeignKey("collections.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("gram", sa.String(16), primary_key=True),
        sa.Column("item_id", ItemId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("occurrences", sa.Integer(), nullable=False),
        sa.Column("coverage", sa.Float(), nullable=False),
    )
    # Deleting an item finds its grams by item id (ON DELETE CASCADE on PostgreSQL needs the index).
    op.create_index("ix_item_text_grams_item", "item_text_grams", ["item_id"])
    # A query of one gram (a common character is in most texts) reads its postings in rank order and
    # stops after the page, instead of reading and ranking every text that holds it.
    op.create_index(
        "ix_item_text_grams_rank",
        "item_text_grams",
        ["collection_id", "gram", sa.text("coverage DESC"), sa.text("occurrences DESC"), "item_id"],
    )


def downgrade() -> None:
    op.drop_table("item_text_grams")
    op.drop_table("item_texts")
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table(
        "collections", recreate="always" if sqlite else "auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.drop_column("ocr")
