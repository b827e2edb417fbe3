"""The tests of indexer/domain/: records and pure rules (names, the index grammar, photo dates, perceptual
hashes), without storage. It shares helpers only through tests/support/ and fixtures only through
conftest.py; no test module imports another."""
