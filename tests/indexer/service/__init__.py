"""The tests of indexer/service/: the collection service and its feature services (searches, near-
duplicates, migrations, thumbnails) over a real catalog. It shares helpers only through tests/support/ and
fixtures only through conftest.py; no test module imports another."""
