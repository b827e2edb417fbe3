"""JSON tensor data (api/kserve_tensors.py): numpy reads a regular nesting of finite numbers in one
call; whatever it reads, and whatever it leaves to the element-by-element path, the answer — array
or error message — is the element-by-element path's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import api.kserve_tensors as tensors
from api.kserve_tensors import MODELS, BadRequest, InferRequest, decode_input


class Shapes:
    context_length = 4
    image_size = 2


def request(name: str, datatype: str, shape: list[int], data: Any) -> InferRequest:
    return InferRequest.model_validate({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]})


def outcome(model: str, req: InferRequest) -> tuple[str, Any]:
    try:
        array = decode_input(MODELS[model], req, b"", Shapes())
    except BadRequest as exc:
        return "error", exc.message
    return str(array.dtype), array.tolist()


IMAGE = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2) / 7
CASES: list[tuple[str, str, list[int], Any]] = [
    ("cnclip_image", "FP32", [1, 3, 2, 2], IMAGE.tolist()),  # nested
    ("cnclip_image", "FP32", [1, 3, 2, 2], IMAGE.ravel().tolist()),  # flat
    ("cnclip_image", "FP32", [1, 3, 2, 2], list(range(12))),  # ints for floats
    ("cnclip_image", "FP32", [1, 3, 2, 2], [2**60 + 1] + [0] * 11),  # an int a double rounds
    ("cnclip_image", "FP32", [1, 3, 2, 2], [True] + [0.5] * 11),  # a bool among floats
    ("cnclip_image", "FP32", [1, 3, 2, 2], [None] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], ["1.0"] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [[0.5] * 6, [0.5] * 5]),  # ragged
    ("cnclip_image", "FP32", [1, 3, 2, 2], [[0.5] * 6, [[0.5] * 6]]),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [10**400] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [2**64 - 1] + [0] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [3.5e38] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [float("inf")] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [float("nan")] + [0.5] * 11),
    ("cnclip_image", "FP32", [1, 3, 2, 2], [0.5] * 11),  # one short
    ("cnclip_image", "FP32", [1, 3, 2, 2], []),
    ("cnclip_text", "INT64", [2, 4], [[101, 5, 102, 0], [101, 7, 102, 0]]),
    ("cnclip_text", "INT64", [2, 4], [101, 5, 102, 0, 101, 7, 102, 0]),
    ("cnclip_text", "INT64", [2, 4], [101.0, 5.5, 102, 0, 101, 7, 102, 0]),  # floats for ids
    ("cnclip_text", "INT64", [2, 4], [21128, 5, 102, 0, 101, 7, 102, 0]),  # past the vocabulary
    ("cnclip_text", "INT64", [2, 4], [-1, 5, 102, 0, 101, 7, 102, 0]),
    ("cnclip_text", "INT64", [2, 4], [-0.5, 5, 102, 0, 101, 7, 102, 0]),
    ("cnclip_text", "INT64", [2, 4], [2**70, 5, 102, 0, 101, 7, 102, 0]),
    ("cnclip_text", "INT64", [2, 4], [2**63, 5, 102, 0, 101, 7, 102, 0]),
    ("cnclip_text", "INT64", [2, 4], [True, False, 1, 0, 1, 1, 1, 0]),
    ("cnclip_text", "INT64", [2, 4], [[True, False, True, False], [True] * 4]),  # all bools
    ("cnclip_text", "INT64", [2, 4], [[1, 2, 3, 4], {"a": 1}]),
]


@pytest.mark.parametrize(("model", "datatype", "shape", "data"), CASES, ids=range(len(CASES)))
def test_json_data_reads_the_same_with_or_without_numpys_one_call(
    monkeypatch: pytest.MonkeyPatch, model: str, datatype: str, shape: list[int], data: Any
) -> None:
    name = MODELS[model].input_name
    req = request(name, datatype, shape, data)
    answer = outcome(model, req)
    monkeypatch.setattr(tensors, "_regular_numbers", lambda data: None)  # element by element only
    assert answer == outcome(model, req)


def test_a_regular_list_of_numbers_is_read_without_going_element_by_element(monkeypatch: pytest.MonkeyPatch) -> None:
    def element_by_element(data: Any) -> list[Any]:
        raise AssertionError("the one-call path should have read this")

    monkeypatch.setattr(tensors, "_flatten", element_by_element)
    data = np.random.default_rng(0).normal(size=(1, 3, 2, 2)).astype(np.float32)
    array = decode_input(MODELS["cnclip_image"], request("image", "FP32", [1, 3, 2, 2], data.tolist()), b"", Shapes())
    assert np.array_equal(array, data)
