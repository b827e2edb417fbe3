"""The FAISS engine: an index per collection in checksummed files under the data dir, written
atomically (file.py), with the changes since appended to a log beside it (delta.py; when a save
appends and when it rewrites: saving.py), built from the engine-neutral index description (index.py), behind the
`VectorStore` protocol (store.py).

It may import storage/vectors/base.py, domain/, fs/ and `indexer/errors.py`; nothing of the other
engine or of storage/sql/."""
