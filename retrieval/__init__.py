"""Model runtime: tokenizer, preprocessing, manifests, ONNX Runtime sessions, batching, encoders.

No web framework and no SQL here: `indexer` and `api` build on this package, never the reverse.
"""

from retrieval.preprocess import preprocess_image, probe_image
from retrieval.tokenizer import tokenize

__all__ = ["preprocess_image", "probe_image", "tokenize"]
