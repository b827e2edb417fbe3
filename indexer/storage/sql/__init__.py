"""SQL, the catalog's source of truth: SQLAlchemy and nothing else — the schema (models.py), the
engine and its sessions (db.py), and the queries, one module per concern (items, inserts, moves,
deletions, duplicates, generations, photo dates, recognised text, …). Alembic's migrations/ keep the
schema; a test holds models and migrations equal.

It may import domain/, fs/, storage/media/ (an upload's copy is written with its row),
`indexer/errors.py` and `indexer/config.py`; never a vector engine (vectors/faiss/, vectors/milvus/)."""
