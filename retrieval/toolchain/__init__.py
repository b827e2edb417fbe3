"""The model toolchain, apart from the runtime core a request runs: conversion of checkpoints into
static ONNX graphs (convert/, the only place torch lives), the Triton model repository export and
the bundled tritonserver launcher (triton/), and the encoder benchmark (bench.py). The runtime
core (the rest of retrieval/) never imports this package (tests/contract/test_architecture.py)."""
