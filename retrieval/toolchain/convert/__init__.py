"""Conversion of CN-CLIP checkpoints to static-graph ONNX model directories (torch only here)."""

ARCH_NAMES = ("RN50", "ViT-B-16", "ViT-L-14", "ViT-L-14-336", "ViT-H-14")  # the released architectures
