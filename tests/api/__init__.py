"""The tests of api/: the app factory, routes, schemas, limits, errors, metrics and the /v2 protocol,
through FastAPI's test client or a live server. It shares helpers only through tests/support/ and fixtures
only through conftest.py; no test module imports another."""
