"""The tests of indexer/storage/: the catalog, SQL, the vector engines (the contract tests every engine
runs), media copies, lock order and migrations. It shares helpers only through tests/support/ and fixtures
only through conftest.py; no test module imports another."""
