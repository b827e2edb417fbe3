"""Model runtime: tokenizer, preprocessing, manifests, ONNX Runtime sessions, batching, encoders.

No web framework and no SQL here: `indexer` and `api` build on this package, never the reverse.
"""
