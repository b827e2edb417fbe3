"""A tiny model directory built from plain ONNX operators, with no torch and no download.

It has the runtime's real interface (cn_clip token ids in, 224-px normalised images in,
L2-normalised features out, one fixed-shape graph per bucket, fp32 and int8) but not CN-CLIP's
architecture, so tests of the runtime, indexer and API can run before and without any trained
model. Its answers mean nothing; `models/cnclip-demo` is the small model whose answers do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from retrieval.graph_store import save_sharing_weights
from retrieval.manifest import ModelManifest, TowerSpec

VOCAB_SIZE = 21128
CONTEXT_LENGTH = 52
OPSET = 17


def _text_graph(batch: int, length: int, embedding: np.ndarray, proj: np.ndarray) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gather", ["embedding", "text"], ["tok"]),  # [b, L, w]
        helper.make_node("Greater", ["text", "zero_i64"], ["nonpad"]),
        helper.make_node("Cast", ["nonpad"], ["mask2"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask2", "axis_last"], ["mask"]),  # [b, L, 1]
        helper.make_node("Mul", ["tok", "mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_one"], ["summed"], keepdims=0),  # [b, w]
        helper.make_node("MatMul", ["summed", "text_proj"], ["raw"]),
        helper.make_node("LpNormalization", ["raw"], ["text_features"], axis=1, p=2),
    ]
    graph = helper.make_graph(
        nodes,
        "toy_text",
        [helper.make_tensor_value_info("text", TensorProto.INT64, [batch, length])],
        [helper.make_tensor_value_info("text_features", TensorProto.FLOAT, [batch, proj.shape[1]])],
        initializer=[
            numpy_helper.from_array(embedding, "embedding"),
            numpy_helper.from_array(proj, "text_proj"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero_i64"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis_last"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_one"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _image_graph(batch: int, image_size: int, pool: int, proj: np.ndarray) -> onnx.ModelProto:
    nodes = [
        helper.make_node("AveragePool", ["image"], ["pooled"], kernel_shape=[pool, pool], strides=[pool, pool]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "image_proj"], ["raw"]),
        helper.make_node("LpNormalization", ["raw"], ["image_features"], axis=1, p=2),
    ]
    graph = helper.make_graph(
        nodes,
        "toy_image",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, image_size, image_size])],
        [helper.make_tensor_value_info("image_features", TensorProto.FLOAT, [batch, proj.shape[1]])],
        initializer=[numpy_helper.from_array(proj, "image_proj")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _rounded(w: np.ndarray, levels: float) -> np.ndarray:
    """`w` rounded to `levels` steps each side of 0 (1.0: as it is)."""
    if levels == 1.0:
        return w
    scale = np.abs(w).max() / levels
    return (np.round(w / scale) * scale).astype(np.float32)


def _text_graphs(
    precision: str, buckets: tuple[int, ...], text_lengths: tuple[int, ...], embedding: np.ndarray, proj: np.ndarray
) -> tuple[dict[str, onnx.ModelProto], dict[int, dict[int, str]]]:
    """The text graphs of one precision (file -> graph): the full length per bucket, and the shorter
    lengths (length -> bucket -> file)."""
    graphs = {f"text.{precision}.b{b}.onnx": _text_graph(b, CONTEXT_LENGTH, embedding, proj) for b in buckets}
    short: dict[int, dict[int, str]] = {}
    for b in buckets:
        for length in text_lengths:
            file = f"text.{precision}.b{b}.l{length}.onnx"
            graphs[file] = _text_graph(b, length, embedding, proj)
            short.setdefault(length, {})[b] = file
    return graphs, short


def write_toy_model(
    directory: Path,
    dim: int = 32,
    buckets: tuple[int, ...] = (1, 4, 8, 16, 32),
    image_size: int = 224,
    seed: int = 0,
    int8: bool = True,
    name: str = "toy",
    text_lengths: tuple[int, ...] = (),
) -> ModelManifest:
    """Write a complete model directory (graphs, shared weights, manifest) and return its manifest.

    `text_lengths`: shorter text length buckets (e.g. (16, 32)) besides the full 52 tokens; the toy
    text graph sums masked token embeddings, so its answer does not depend on the length either."""
    rng = np.random.default_rng(seed)
    width = 16
    pool = image_size // 7
    cells = (image_size // pool) ** 2 * 3
    embedding = rng.standard_normal((VOCAB_SIZE, width)).astype(np.float32)
    text_proj = rng.standard_normal((width, dim)).astype(np.float32)
    image_proj = rng.standard_normal((cells, dim)).astype(np.float32)

    towers: dict[str, dict[str, dict[int, str]]] = {"image": {}, "text": {}}
    short_text: dict[str, dict[int, dict[int, str]]] = {}
    data_files: list[str] = []
    variants = [("fp32", 1.0)] + ([("int8", 127.0)] if int8 else [])
    for precision, levels in variants:
        # The "int8" variant rounds the weights to 8-bit levels: a different graph with nearby answers,
        # which is what tests of precision choice need (real int8 graphs come from `cnclip convert`).
        text_graphs, short_text[precision] = _text_graphs(
            precision, buckets, text_lengths, _rounded(embedding, levels), _rounded(text_proj, levels)
        )
        image_graphs = {
            f"image.{precision}.b{b}.onnx": _image_graph(b, image_size, pool, _rounded(image_proj, levels))
            for b in buckets
        }
        for tower, graphs in (("image", image_graphs), ("text", text_graphs)):
            towers[tower][precision] = {b: f"{tower}.{precision}.b{b}.onnx" for b in buckets}
            data_name = f"{tower}.{precision}.data"
            save_sharing_weights(graphs, directory, data_name)
            data_files.append(data_name)
    short_text = {precision: lengths for precision, lengths in short_text.items() if lengths}

    manifest = ModelManifest(
        name=name,
        arch="toy",
        embed_dim=dim,
        image_size=image_size,
        context_length=CONTEXT_LENGTH,
        logit_scale=100.0,
        towers={
            "image": TowerSpec("image", "image_features", towers["image"]),
            "text": TowerSpec("text", "text_features", towers["text"], short_text),
        },
        extra={"source": "retrieval.toolchain.toy_model", "seed": seed},
    )
    return manifest.save(Path(directory), data_files=data_files)
