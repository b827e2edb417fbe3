"""What the server spends reading a `/v2` tensor request body: JSON `data` against the binary extension.

    python benchmarks/bench_json_tensors.py [--repeats 20]

For one 224 px FP32 image (nested and flat JSON lists) and a batch of 8 INT64 text rows, the median
time of `split_body` (the JSON header, pydantic) plus `decode_input` (checks, conversion to numpy),
as api/kserve.py runs them, and the same tensor as binary data. On a shared machine: noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from api.kserve_tensors import MODELS, decode_input, split_body  # noqa: E402


class Shapes:
    context_length = 52
    image_size = 224


def bodies(array: np.ndarray, name: str, datatype: str) -> dict[str, tuple[bytes, int | None]]:
    """JSON (nested, flat) and binary request bodies, with the binary header's length."""
    tensor = {"name": name, "shape": list(array.shape), "datatype": datatype}
    nested = json.dumps({"inputs": [{**tensor, "data": array.tolist()}]}).encode()
    flat = json.dumps({"inputs": [{**tensor, "data": array.ravel().tolist()}]}).encode()
    raw = array.tobytes()
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return {"json nested": (nested, None), "json flat": (flat, None), "binary": (header + raw, len(header))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "cnclip_image": bodies(rng.normal(size=(1, 3, 224, 224)).astype("<f4"), "image", "FP32"),
        "cnclip_text": bodies(rng.integers(0, 21128, (8, 52)).astype("<i8"), "text", "INT64"),
    }
    print("model | body | bytes | read ms (median)")
    for model, variants in cases.items():
        for label, (body, header_length) in variants.items():
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                req, binary = split_body(body, header_length)
                decode_input(MODELS[model], req, binary, Shapes())
                times.append(time.perf_counter() - start)
            print(f"{model} | {label} | {len(body):,} | {statistics.median(times) * 1000:.2f}")


if __name__ == "__main__":
    main()
