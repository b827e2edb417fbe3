"""Cross-cutting: the contracts the whole repository keeps — the architecture and the test tree, the docs
and the settings table, the OpenAPI snapshot, hostile input. It shares helpers only through tests/support/
and fixtures only through conftest.py; no test module imports another."""
