"""The model toolchain, apart from the runtime core a request runs: conversion of checkpoints into
static ONNX graphs (convert/, the only place torch lives), the Triton model repository export and
the bundled tritonserver launcher (triton/), the tuner behind `cnclip tune` (tune/), the quality gate
both of them run (gate.py), the toy model the tests build (toy_model.py), and the encoder benchmark
(bench.py). The runtime core (the rest of retrieval/) never imports this package
(tests/contract/test_architecture.py); the toolchain imports the runtime core."""
