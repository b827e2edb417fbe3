"""The tests of indexer/fs/: the file-system rules (file names kept exactly, safe opening). It shares
helpers only through tests/support/ and fixtures only through conftest.py; no test module imports another."""
