"""The tests of indexer/, one folder per package (tests/indexer/<package>/ for indexer/<package>/); this
folder itself holds only the tests of indexer's root modules (test_runtime.py for runtime.py). It shares
helpers only through tests/support/ and fixtures only through conftest.py; no test module imports another."""
