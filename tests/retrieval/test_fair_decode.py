"""Issue 28, item 2: one request cannot hold everyone's images.

The decode pool (retrieval/fair_pool.py) serves requests by turns, and every route that takes images
checks a per-request pixel budget from the headers before anything is decoded
(retrieval/image_budget.py, `CNCLIP_MAX_REQUEST_PIXELS`)."""

from __future__ import annotations

import asyncio
import io
import threading
import time

import pytest
from PIL import Image, ImageFile

from api.config import Settings
from api.uploads import inspect_images
from retrieval.errors import EncoderUnavailable, InvalidImage, PayloadTooLarge
from retrieval.fair_pool import FairPool, ItemFailed
from retrieval.fake import FakeEncoder
from retrieval.image_budget import DEFAULT_IMAGES_PER_REQUEST, check_request_images, request_pixel_limit
from tests.support.api_helpers import api_client
from tests.support.decode_load import v2_bytes_request


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, "PNG")
    return out.getvalue()


# --- the request's pixel budget --------------------------------------------------------------------------


def test_the_budget_counts_every_image_of_the_request_together() -> None:
    images = [png(100, 100)] * 3  # 10,000 px each
    headers = check_request_images(images, max_bytes=1 << 20, max_pixels=10_000, max_request_pixels=30_000)
    assert [(h.width, h.height) for h in headers] == [(100, 100)] * 3
    with pytest.raises(PayloadTooLarge) as refused:
        check_request_images(images, max_bytes=1 << 20, max_pixels=10_000, max_request_pixels=29_999)
    assert "CNCLIP_MAX_REQUEST_PIXELS" in refused.value.message
    assert "29,999" in refused.value.message


def test_the_budget_is_read_from_headers_before_any_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[object] = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self))
    images = [png(2000, 2000)] * 4
    with pytest.raises(PayloadTooLarge):
        check_request_images(images, max_bytes=1 << 20, max_pixels=4_000_000, max_request_pixels=10_000_000)
    assert loads == []


def test_each_image_still_meets_the_per_image_rules_and_is_named() -> None:
    images = [png(10, 10), png(200, 200)]
    with pytest.raises(InvalidImage) as refused:
        check_request_images(images, max_bytes=1 << 20, max_pixels=1000, max_request_pixels=10**9)
    assert refused.value.message.startswith("image 1: ")
    assert not isinstance(refused.value, PayloadTooLarge)
    with pytest.raises(InvalidImage) as broken:
        check_request_images(
            [png(10, 10), b"not an image"], max_bytes=1 << 20, max_pixels=1000, max_request_pixels=1000
        )
    assert broken.value.message.startswith("image 1: ")


def test_the_default_budget_is_eight_images_of_the_largest_size() -> None:
    assert request_pixel_limit(50_000_000, None) == DEFAULT_IMAGES_PER_REQUEST * 50_000_000 == 400_000_000
    assert request_pixel_limit(50_000_000, 1234) == 1234
    settings = Settings(max_image_pixels=10_000, max_request_pixels=None)
    assert len(inspect_images([png(100, 100)] * 8, settings)) == 8
    with pytest.raises(PayloadTooLarge):
        inspect_images([png(100, 100)] * 9, settings)


def test_the_issue_request_is_refused_by_the_default_budget() -> None:
    """150 PNGs of 7000×7000 (49 Mpx each, each under CNCLIP_MAX_IMAGE_PIXELS): refused from the headers."""
    bomb = png(7000, 7000)
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge):
        inspect_images([bomb] * 150, Settings())
    assert time.perf_counter() - started < 1.0  # headers only: one decode alone takes ~0.5 s


def test_a_single_image_route_obeys_a_request_budget_below_the_image_limit() -> None:
    settings = Settings(max_image_pixels=50_000, max_request_pixels=5_000)
    with pytest.raises(PayloadTooLarge):
        inspect_images([png(100, 100)], settings)


# --- fair order ------------------------------------------------------------------------------------------


class Gate:
    """A job that waits until the test lets it finish, recording the order jobs ran in."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, item: str) -> str:
        with self.lock:
            self.order.append(item)
        if item.startswith("hold"):
            self.release.wait(10)
        return item.upper()


async def _settle(pool: FairPool, count: int) -> None:
    for _ in range(500):
        if len(pool.started) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(pool.started)} items started")


def test_a_new_request_goes_before_the_backlog_and_requests_then_take_turns() -> None:
    async def main() -> list[str]:
        pool = FairPool(1, history=100)
        gate = Gate()
        try:
            hold = asyncio.ensure_future(pool.map(gate, ["hold"], label="hold"))
            await _settle(pool, 1)
            bomb = asyncio.ensure_future(pool.map(gate, [f"a{i}" for i in range(6)], label="A"))
            await asyncio.sleep(0.05)
            other = asyncio.ensure_future(pool.map(gate, [f"b{i}" for i in range(3)], label="B"))
            await asyncio.sleep(0.05)
            victim = asyncio.ensure_future(pool.map(gate, ["v"], label="V"))
            await asyncio.sleep(0.05)
            gate.release.set()
            assert await victim == ["V"]
            assert await bomb == [f"A{i}" for i in range(6)]
            assert await other == ["B0", "B1", "B2"]
            await hold
            return list(pool.started)
        finally:
            pool.close()

    # First images in the order they came (A, B, V), then one image per request in turn.
    assert asyncio.run(main()) == ["hold", "A", "B", "V", "A", "B", "A", "B", "A", "A", "A"]


def test_a_victim_waits_for_at_most_the_images_in_flight() -> None:
    """Two workers busy with a 50-image request: the victim's one image is the next one started."""

    async def main() -> tuple[int, list[str]]:
        pool = FairPool(2, history=100)
        gate = Gate()
        try:
            bomb = asyncio.ensure_future(pool.map(gate, [f"hold{i}" for i in range(50)], label="A"))
            await _settle(pool, 2)
            victim = asyncio.ensure_future(pool.map(gate, ["v"], label="V"))
            await asyncio.sleep(0.05)
            gate.release.set()
            await victim
            await bomb
            return list(pool.started).index("V"), list(pool.started)
        finally:
            pool.close()

    position, started = asyncio.run(main())
    assert position == 2, started


def test_a_failed_item_drops_the_rest_of_its_request_and_names_its_index() -> None:
    ran: list[int] = []

    def job(i: int) -> int:
        ran.append(i)
        if i == 1:
            raise InvalidImage("broken")
        time.sleep(0.01)
        return i

    async def main() -> ItemFailed:
        pool = FairPool(1)
        try:
            with pytest.raises(ItemFailed) as failed:
                await pool.map(job, list(range(20)))
            await asyncio.sleep(0.05)
            return failed.value
        finally:
            pool.close()

    failure = asyncio.run(main())
    assert failure.index == 1 and isinstance(failure.error, InvalidImage)
    assert len(ran) <= 3  # the one running when the failure came may finish; the rest never start


def test_a_cancelled_request_frees_its_turns() -> None:
    async def main() -> tuple[list[str], list[str]]:
        pool = FairPool(1, history=100)
        gate = Gate()
        try:
            bomb = asyncio.ensure_future(pool.map(gate, [f"hold{i}" for i in range(30)], label="A"))
            await _settle(pool, 1)
            bomb.cancel()  # the client went away
            with pytest.raises(asyncio.CancelledError):
                await bomb
            gate.release.set()
            assert await pool.map(gate, ["v"], label="V") == ["V"]
            return list(pool.started), gate.order
        finally:
            pool.close()

    started, order = asyncio.run(main())
    assert started == ["A", "V"]
    assert order == ["hold0", "v"]


def test_closing_resolves_every_queued_future() -> None:
    async def main() -> None:
        pool = FairPool(1)
        gate = Gate()
        first = asyncio.ensure_future(pool.map(gate, ["hold"]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(pool.map(gate, ["x", "y"]))
        await asyncio.sleep(0.05)
        pool.close()
        gate.release.set()
        assert await first == ["HOLD"]  # the running one finishes
        with pytest.raises(ItemFailed) as failed:
            await asyncio.wait_for(queued, 5)
        assert isinstance(failed.value.error, EncoderUnavailable)
        assert gate.order == ["hold"]
        with pytest.raises(EncoderUnavailable):
            await pool.map(gate, ["z"])

    asyncio.run(main())


# --- every route that takes images applies the request budget ---------------------------------------------

ROUTES = [
    ("/v1/embed/image", {}, 2),
    ("/v1/search/image", {}, 1),
    ("/v1/classify", {"labels": "猫,狗"}, 1),
    ("/v1/collections/photos/items", {}, 1),
    ("/v2/models/cnclip_image_bytes/infer", None, 2),
]


@pytest.mark.parametrize(("route", "form", "count"), ROUTES, ids=[r[0] for r in ROUTES])
def test_every_image_route_refuses_a_request_over_the_pixel_budget(
    settings: Settings, route: str, form: dict[str, str] | None, count: int
) -> None:
    encoder = FakeEncoder()
    # 100×100 images: within the per-image limit, but `count` of them are over a budget of 15,000 pixels,
    # and with one image the budget is set below it (a request budget under the image limit binds too).
    budget = 15_000 if count > 1 else 5_000
    limited = settings.model_copy(update={"max_image_pixels": 10_000, "max_request_pixels": budget})
    with api_client(limited, encoder=encoder) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        images = [png(100, 100)] * count
        if form is None:
            body, headers = v2_bytes_request(images)
            response = client.post(route, content=body, headers=headers)
            message = response.json()["error"]
        else:
            files = [("file", (f"{i}.png", image, "image/png")) for i, image in enumerate(images)]
            response = client.post(route, files=files, data=form)
            assert response.json()["error"]["code"] == "payload_too_large"
            message = response.json()["error"]["message"]
    assert response.status_code == 413, response.text
    assert "CNCLIP_MAX_REQUEST_PIXELS" in message and f"{budget:,}" in message
    assert [call for call in encoder.calls if call[0] == "image"] == []  # refused before any embedding


@pytest.mark.parametrize("kind", ["jpeg scans", "png chunks"])
@pytest.mark.parametrize(("route", "form", "count"), ROUTES, ids=[r[0] for r in ROUTES])
def test_every_image_route_refuses_a_jpeg_whose_decoding_would_cost_more_than_its_pixels(
    settings: Settings, route: str, form: dict[str, str] | None, count: int, kind: str
) -> None:
    """The budget counts what decoding costs, not only pixels: a 64×64 progressive JPEG of 20,000 scans
    (a pass over the image each; 16 Mpx of it took 22 s), or an 8×8 PNG of 200,000 chunks (Pillow walks
    them in Python), is refused from its header on every route, at once, and nothing is embedded
    (retrieval/preprocess.py `MAX_JPEG_SCANS`, `MAX_PNG_CHUNKS`)."""
    from tests.support.crafted_images import jpeg_of_scans, png_of_chunks

    encoder = FakeEncoder()
    bomb, said = (jpeg_of_scans(20_000), "20,000 scans") if kind == "jpeg scans" else (png_of_chunks(200_000), "chunks")
    with api_client(settings, encoder=encoder) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        images = [png(8, 8)] * (count - 1) + [bomb]
        started = time.monotonic()
        if form is None:
            body, headers = v2_bytes_request(images)
            response = client.post(route, content=body, headers=headers)
            message = response.json()["error"]
        else:
            files = [("file", (f"{i}.jpg", image, "image/jpeg")) for i, image in enumerate(images)]
            response = client.post(route, files=files, data=form)
            message = response.json()["error"]["message"]
        elapsed = time.monotonic() - started
    assert response.status_code in (400, 422), response.text
    assert said in message, message
    assert elapsed < 5, elapsed
    assert [call for call in encoder.calls if call[0] == "image"] == []
