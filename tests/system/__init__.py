"""Cross-cutting: the system as deployed — real processes, real servers (PostgreSQL, Milvus, Triton, Ray),
crash safety, installs and the lock file. It shares helpers only through tests/support/ and fixtures only
through conftest.py; no test module imports another."""
