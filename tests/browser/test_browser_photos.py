"""Phone photos in Chromium, at 1280 px and 390 px (issue 31): HEIC and AVIF items show their
thumbnails (JPEG, whatever the original), the item page shows a HEIC through its JPEG rendition, and a
HEIC picked in 以图搜图 is searched."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.api_helpers import GALLERY
from tests.support.browser_support import Server, run_server, screenshot
from tests.support.photo_fixtures import avif_bytes, exif_bytes, heic_bytes, picture

pytestmark = pytest.mark.browser
PHONE = {"手机照片 HEIC": ("IMG_0001.HEIC", "heic"), "手机照片 AVIF": ("IMG_0002.avif", "avif")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[Server]:
    for running in run_server(tmp_path_factory.mktemp("browser-photos"), toy_model_dir):
        with httpx.Client(base_url=running.base) as client:
            for caption, (name, kind) in PHONE.items():
                data = (heic_bytes if kind == "heic" else avif_bytes)(picture(300, 200), exif_bytes(6))
                r = client.post(
                    "/v1/collections/photos/items",
                    files={"file": (name, data, f"image/{kind}")},
                    data={"caption": caption},
                )
                assert r.status_code == 201, r.text
        yield running


LOADED = "imgs => imgs.map(i => [i.closest('.card').textContent, i.complete && i.naturalWidth > 0])"


def test_heic_and_avif_thumbnails_and_the_item_page_show_in_chromium(page: Page, width: int) -> None:
    page.fill("#query", "手机照片")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    expect(cards).to_have_count(len(GALLERY) + len(PHONE))
    phone_cards = cards.filter(has_text="手机照片")
    expect(phone_cards).to_have_count(len(PHONE))
    for index in range(len(PHONE)):
        expect(phone_cards.nth(index).locator("img")).to_have_js_property("complete", True)
    loaded = phone_cards.locator("img").evaluate_all(LOADED)
    assert len(loaded) == len(PHONE) and all(ok for _, ok in loaded), loaded
    sizes = phone_cards.locator("img").evaluate_all("imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])")
    assert all(w == 200 and h == 300 for w, h in sizes), sizes  # oriented (EXIF 6), at most 320 px
    screenshot(page, f"phone_thumbnails_{width}")

    phone_cards.filter(has_text="HEIC").locator("a").click()
    image = page.locator("#item-image")
    expect(image).to_have_attribute("src", re.compile(r"/image\?format=jpeg$"))
    expect(image).to_have_js_property("complete", True)
    assert image.evaluate("i => i.naturalWidth") == 200 and image.evaluate("i => i.naturalHeight") == 300
    expect(page.locator("#item-meta")).to_contain_text("image/heif")
    screenshot(page, f"phone_item_{width}")


def test_a_heic_can_be_picked_and_searched(page: Page, width: int) -> None:
    accept = (page.locator("#image-file").get_attribute("accept") or "").split(",")
    assert {".heic", ".avif", ".dng", "image/heic"} <= set(accept)
    page.click("#tab-image")
    data = heic_bytes(picture(300, 200, 9))
    page.set_input_files("#image-file", files=[{"name": "IMG_0003.HEIC", "mimeType": "image/heic", "buffer": data}])
    expect(page.locator("#panel-image .results .card")).to_have_count(len(GALLERY) + len(PHONE))
    expect(page.locator("#panel-image .error")).to_be_hidden()
    expect(page.locator("#image-drop .file-name")).to_have_text("已选择：IMG_0003.HEIC")
    screenshot(page, f"heic_pick_{width}")
