"""Tests of indexer/storage/vectors/: the vector engines."""
