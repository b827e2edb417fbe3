"""The Milvus engine, Lite file or server alike (one record in the registry): the store behind the
`VectorStore` protocol (store.py), the index plan from the engine-neutral description and what a
server's version supports (plan.py), and one process per Lite file (lite.py). pymilvus is imported
only when this engine is chosen (the `milvus` extra).

It may import storage/vectors/base.py, domain/, fs/ and `indexer/errors.py`; nothing of the other
engine or of storage/sql/."""
