"""Text in photos (issue 32): recognition with RapidOCR's PP-OCR models, which its wheel ships
(nothing is downloaded), on ONNX Runtime sessions opened through the backend seam
(retrieval/backends/onnxruntime.py) like the CLIP ones. `types` holds the records, `engine` the
engine, `reader` the bounded, failure-proof reader the indexing pipeline and uploads call."""
