"""The tests of indexer/bulk/: the bulk indexing pipeline, its sources and readers, moves by content, photo
formats. It shares helpers only through tests/support/ and fixtures only through conftest.py; no test module
imports another."""
