"""Storage: SQL catalog (source of truth) + FAISS indexes (derived), bulk indexing pipeline, CLI."""
