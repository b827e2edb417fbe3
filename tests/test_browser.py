"""The web UI in Debian's Chromium (Playwright), against a real uvicorn server on a free port.

Each test saves a screenshot into tests/artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from api import create_app
from retrieval.config import Settings
from retrieval.fake import FakeEncoder
from tests.api_helpers import GALLERY, image_bytes, open_test_catalog

pytestmark = pytest.mark.browser
# The CI machine is small and shared: give each UI expectation more than Playwright's default 5 s.
expect.set_options(timeout=20_000)

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TEXTS = ["一只猫在沙发上睡觉", "草地上奔跑的小狗", "城市街道上的黄色出租车", "夕阳下的海滩", "雪山和蓝天"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gallery_image(color: tuple[int, int, int]) -> bytes:
    return image_bytes(color, size=(320, 240), fmt="JPEG")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """uvicorn in a thread, FakeEncoder + the real catalog, seeded through the API."""
    settings = Settings(
        _env_file=None, model_dir=toy_model_dir, data_dir=tmp_path_factory.mktemp("browser"), provider="cpu"
    )
    catalog = open_test_catalog(settings)
    port = _free_port()
    config = uvicorn.Config(
        create_app(settings, encoder=FakeEncoder(), catalog=catalog), host="127.0.0.1", port=port, log_level="warning"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    ids: dict[str, int] = {}
    with httpx.Client(base_url=base) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        for caption, tags, color in GALLERY:
            r = client.post(
                "/v1/collections/photos/items",
                files={"file": ("p.jpg", gallery_image(color), "image/jpeg")},
                data={"caption": caption, "tags": json.dumps(tags)},
            )
            assert r.status_code == 201, r.text
            ids[caption] = r.json()["id"]
        assert client.post("/v1/collections", json={"name": "sentences", "kind": "texts"}).status_code == 201
        assert client.post("/v1/collections/sentences/texts", json={"texts": TEXTS}).status_code == 201
        assert client.post("/v1/collections", json={"name": "empty", "kind": "images"}).status_code == 201
    try:
        yield base, ids
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        catalog.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, server: tuple[str, dict[str, int]]) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="zh-CN")
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # Every UI test runs under the server's Content Security Policy: a blocked script, style or image
    # (an inline handler, a CDN asset, a blob: preview the policy forgot) is a console error here.
    blocked: list[str] = []
    pg.on("console", lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None)
    response = pg.goto(server[0] + "/")
    assert response is not None and "default-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    expect(pg.locator("#collection option")).not_to_have_count(0)
    yield pg
    context.close()
    assert not errors, f"JavaScript errors: {errors}"
    assert not blocked, f"blocked by the Content Security Policy: {blocked}"


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_text_search_shows_a_grid_of_thumbnails(page: Page, server: tuple[str, dict[str, int]]) -> None:
    expect(page.locator("#collection")).to_have_value("photos")
    page.fill("#query", "穿红色裙子的女孩")
    page.click("#search-button")
    cards = page.locator("#results .card")
    expect(cards).to_have_count(len(GALLERY))
    expect(page.locator("#results-title")).to_contain_text("编码")  # per-stage timings shown
    first = cards.first.locator("img")
    expect(first).to_have_attribute("loading", "lazy")
    # Polled from here: wait_for_function evaluates its predicate with eval, which the page's CSP forbids.
    loaded = "() => [...document.querySelectorAll('#results img')].every(i => i.complete && i.naturalWidth > 0)"
    deadline = time.monotonic() + 10
    while not page.evaluate(loaded):
        assert time.monotonic() < deadline, "thumbnails did not load"
        time.sleep(0.05)
    scores = [float(s.split()[-1]) for s in page.locator("#results .score").all_inner_texts()]
    assert scores == sorted(scores, reverse=True)
    screenshot(page, "text_search")

    # The item page: the image, its caption, and similar images without the item itself.
    cards.first.locator("a").click()
    expect(page.locator("#item-view")).to_be_visible()
    expect(page.locator("#item-caption")).not_to_be_empty()
    expect(page.locator("#results .card")).to_have_count(len(GALLERY) - 1)
    item_id = page.url.rsplit("/", 1)[-1]
    assert item_id not in page.locator("#results .card").evaluate_all("cards => cards.map(c => c.dataset.id)")
    screenshot(page, "item_page")


def test_upload_search_finds_the_same_image_and_matching_texts(page: Page, server: tuple[str, dict[str, int]]) -> None:
    _, ids = server
    caption, _, color = GALLERY[3]
    page.click("#tab-image")
    page.set_input_files(
        "#image-file", files=[{"name": "q.jpg", "mimeType": "image/jpeg", "buffer": gallery_image(color)}]
    )
    first = page.locator("#results .card").first
    expect(first).to_have_attribute("data-id", str(ids[caption]))
    expect(first.locator(".score")).to_have_text("相似度 1.000")
    expect(page.locator("#image-drop .preview")).to_be_visible()
    screenshot(page, "upload_search")

    page.check("input[name=target][value=texts]")
    expect(page.locator("#text-collection")).to_be_visible()
    expect(page.locator("#results .text-card")).to_have_count(len(TEXTS))
    assert set(page.locator("#results .caption").all_inner_texts()) == set(TEXTS)
    screenshot(page, "image_to_text")


def test_classify_shows_probability_bars(page: Page) -> None:
    page.click("#tab-classify")
    page.fill("#labels", "猫, 狗，汽车\n风景")
    page.set_input_files(
        "#classify-file", files=[{"name": "c.png", "mimeType": "image/png", "buffer": image_bytes((90, 60, 30))}]
    )
    rows = page.locator("#probabilities li")
    expect(rows).to_have_count(4)
    values = [float(v.rstrip("%")) for v in page.locator("#probabilities .value").all_inner_texts()]
    assert values == sorted(values, reverse=True)
    assert sum(values) == pytest.approx(100.0, abs=0.3)
    widths = rows.locator(".bar span").evaluate_all("spans => spans.map(s => parseFloat(s.style.width))")
    assert widths == pytest.approx(values, abs=0.11)
    assert set(page.locator("#probabilities .label").all_inner_texts()) == {"猫", "狗", "汽车", "风景"}
    screenshot(page, "classify")


def test_error_and_empty_states(page: Page) -> None:
    # Bytes that are not an image: the server's 422 message appears in the error box.
    page.click("#tab-image")
    page.set_input_files("#image-file", files=[{"name": "bad.png", "mimeType": "image/png", "buffer": b"not an image"}])
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("无法识别这张图片")
    expect(page.locator("#status")).to_be_hidden()  # the loading state ended
    screenshot(page, "error_state")

    # An empty collection: the empty state, and the error box is gone.
    page.click("#tab-text")
    page.select_option("#collection", "empty")
    page.fill("#query", "任何东西")
    page.click("#search-button")
    expect(page.locator("#results .empty")).to_contain_text("没有找到结果")
    expect(error).to_be_hidden()
    screenshot(page, "empty_state")
