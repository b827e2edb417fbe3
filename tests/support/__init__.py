"""Helpers the tests share: real servers (PostgreSQL, Milvus, Triton, Ray), proxies, crafted images and
files, API and CLI helpers. The only place test modules share code besides conftest.py; it imports no test
module and holds no tests."""
