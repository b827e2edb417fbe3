"""Tests of indexer/storage/vectors/faiss/: the FAISS engine (index, store, files)."""
