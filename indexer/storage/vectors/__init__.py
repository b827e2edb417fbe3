"""The vector engines, derived from SQL: the protocols every engine implements and what they share
(base.py: `VectorEngine`, `VectorStore`, `StoreSpec`, `SearchTuning`, `id_checksum`), the registry
that chooses one by `CNCLIP_VECTOR_STORE` (registry.py), and one package per engine (faiss/,
milvus/), imported only when chosen.

It may import domain/, fs/, `indexer/errors.py` and `retrieval`; never storage/sql/ (an engine
holds ids and vectors only; sync.py brings them from SQL)."""
