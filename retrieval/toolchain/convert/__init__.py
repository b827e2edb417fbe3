"""Conversion of CN-CLIP checkpoints to static-graph ONNX model directories (torch only here)."""
