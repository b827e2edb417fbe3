"""The web UI in Debian's Chromium (Playwright), against a real uvicorn server on a free port:
the main flows at 1280 px (test_browser_ui.py checks behaviour at both widths).

Each test saves a screenshot into tests/artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.api_helpers import GALLERY, image_bytes
from tests.support.browser_support import (
    TEXTS,
    PageLog,
    Server,
    gallery_image,
    open_page,
    run_server,
    screenshot,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[Server]:
    yield from run_server(tmp_path_factory.mktemp("browser"), toy_model_dir)


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    log = PageLog(allow_status={404, 422})  # the error-state test provokes these
    pg = open_page(browser, server.base + "/", 1280, log)
    response = pg.context.request.get(server.base + "/")
    assert "default-src 'self'" in response.headers["content-security-policy"]  # the server's own policy
    assert response.headers["x-content-type-options"] == "nosniff"
    expect(pg.locator("#collection option")).not_to_have_count(0)
    yield pg
    pg.context.close()
    log.assert_clean()


def test_text_search_shows_a_grid_of_thumbnails(page: Page, server: Server) -> None:
    expect(page.locator("#collection")).to_have_value("photos")
    page.fill("#query", "穿红色裙子的女孩")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    expect(cards).to_have_count(len(GALLERY))
    expect(page.locator("#panel-text .results-title")).to_contain_text("编码")  # per-stage timings shown
    first = cards.first.locator("img")
    expect(first).to_have_attribute("loading", "lazy")
    # Polled from here: wait_for_function evaluates its predicate with eval, which the page's CSP forbids.
    loaded = (
        "() => [...document.querySelectorAll('#panel-text .results img')].every(i => i.complete && i.naturalWidth > 0)"
    )
    deadline = time.monotonic() + 10
    while not page.evaluate(loaded):
        assert time.monotonic() < deadline, "thumbnails did not load"
        time.sleep(0.05)
    scores = [float(s.split()[-1]) for s in page.locator("#panel-text .results .score").all_inner_texts()]
    assert scores == sorted(scores, reverse=True)
    screenshot(page, "text_search")

    # The item page: the image, its caption, and similar images without the item itself.
    cards.first.locator("a").click()
    expect(page.locator("#item-view")).to_be_visible()
    expect(page.locator("#item-caption")).not_to_be_empty()
    similar = page.locator("#item-view .results .card")
    expect(similar).to_have_count(len(GALLERY) - 1)
    expect(page.locator("#panel-text")).to_be_hidden()  # the item page replaces the tabs
    item_id = page.url.rsplit("/", 1)[-1]
    assert item_id not in similar.evaluate_all("cards => cards.map(c => c.dataset.id)")
    screenshot(page, "item_page")


def test_upload_search_finds_the_same_image_and_matching_texts(page: Page, server: Server) -> None:
    ids = server.ids
    caption, _, color = GALLERY[3]
    page.click("#tab-image")
    page.set_input_files(
        "#image-file", files=[{"name": "q.jpg", "mimeType": "image/jpeg", "buffer": gallery_image(color)}]
    )
    first = page.locator("#panel-image .results .card").first
    expect(first).to_have_attribute("data-id", str(ids[caption]))
    expect(first.locator(".score")).to_have_text("相似度 1.000")
    expect(page.locator("#image-drop .preview")).to_be_visible()
    screenshot(page, "upload_search")

    page.check("input[name=target][value=texts]")
    expect(page.locator("#text-collection")).to_be_visible()
    expect(page.locator("#panel-image .results .text-card")).to_have_count(len(TEXTS))
    assert set(page.locator("#panel-image .results .caption").all_inner_texts()) == set(TEXTS)
    screenshot(page, "image_to_text")


def test_classify_shows_probability_bars(page: Page) -> None:
    page.click("#tab-classify")
    page.fill("#labels", "猫, 狗，汽车\n风景")
    page.set_input_files(
        "#classify-file", files=[{"name": "c.png", "mimeType": "image/png", "buffer": image_bytes((90, 60, 30))}]
    )
    page.click("#classify-button")
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
    error = page.locator("#panel-image .error")
    expect(error).to_be_visible()
    expect(error.locator(".error-text")).to_contain_text("无法识别这张图片")
    expect(page.locator("#panel-image .status")).to_be_hidden()  # the loading state ended
    screenshot(page, "error_state")

    # An empty collection: the empty state, and the error box is gone.
    page.click("#tab-text")
    page.select_option("#collection", "empty")
    page.fill("#query", "任何东西")
    page.click("#search-button")
    expect(page.locator("#panel-text .results .empty")).to_contain_text("没有找到结果")
    expect(page.locator("#panel-text .error")).to_be_hidden()
    screenshot(page, "empty_state")
