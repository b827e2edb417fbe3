"""A victim's image search beside a request of many large images (issue 28, item 2), against a live
server: shared by tests/api/test_fair_decode_live.py (which asserts) and benchmarks/bench_fair_decode.py
(which prints)."""

from __future__ import annotations

import io
import json
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from PIL import Image


def zero_png(side: int) -> bytes:
    """A side × side PNG of zeros: a few dozen KB that decode to side² pixels."""
    out = io.BytesIO()
    Image.new("RGB", (side, side)).save(out, "PNG")
    return out.getvalue()


def v2_bytes_request(images: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """A `cnclip_image_bytes` inference request with binary tensor data, as tritonclient sends it."""
    data = b"".join(struct.pack("<I", len(image)) + image for image in images)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image_bytes",
                    "shape": [len(images), 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "image_features", "parameters": {"binary_data": False}}],
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + data, headers


def search_image(client: httpx.Client, image: bytes) -> float:
    """Seconds one `/v1/search/image` takes (it must answer 200)."""
    started = time.perf_counter()
    response = client.post("/v1/search/image", files={"file": ("q.png", image, "image/png")}, data={"k": "1"})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed


@dataclass
class Beside:
    """What one run measured (seconds)."""

    victim_alone: float  # the victim's search with nothing else running (median of 3)
    victim_beside: float  # the same search started while the bomb request was decoding
    bomb: float  # the bomb request, from sending to its answer
    bomb_status: int
    victim_started_after: float  # when the victim started, counted from the bomb's start


def victim_beside_bomb(
    base_url: str, bomb: list[bytes], victim: bytes, decoding: Callable[[], bool], timeout_s: float = 600
) -> Beside:
    """Time the victim's search alone, then again once the bomb request (`/v2` `cnclip_image_bytes`)
    is being decoded (`decoding()` turns true), and the bomb request itself."""
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        search_image(client, victim)  # warm
        alone = sorted(search_image(client, victim) for _ in range(3))[1]
    body, headers = v2_bytes_request(bomb)
    outcome: dict[str, float | int] = {}

    def send_bomb() -> None:
        with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
            started = time.perf_counter()
            response = client.post("/v2/models/cnclip_image_bytes/infer", content=body, headers=headers)
            outcome["bomb"], outcome["status"] = time.perf_counter() - started, response.status_code

    bomb_started = time.perf_counter()
    thread = threading.Thread(target=send_bomb, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not decoding() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    victim_started_after = time.perf_counter() - bomb_started
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        beside = search_image(client, victim)
    thread.join(timeout_s)
    return Beside(alone, beside, float(outcome["bomb"]), int(outcome["status"]), victim_started_after)
