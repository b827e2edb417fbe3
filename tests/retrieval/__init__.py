"""The tests of retrieval/: the model runtime (manifest, preprocessing, tokenizer, sessions, backends,
batcher, encoders, tuning file) and its toolchain (conversion, the quality gate, the tuner, Triton export).
It shares helpers only through tests/support/ and fixtures only through conftest.py; no test module imports
another."""
