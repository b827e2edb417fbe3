"""The tests of indexer/watch/: folder watchers, their passes, restarts and watched roots. It shares helpers
only through tests/support/ and fixtures only through conftest.py; no test module imports another."""
