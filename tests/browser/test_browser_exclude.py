"""The "不要…" field, at 1280 px and 390 px in Chromium, on the demo gallery with the shipped model (a real
server): "星星" (48 results) shows the 5 red stars; with 红色 in 不要… it shows none and all 39 other stars, the request carries the exclusion, and
the field fits the page (beside the query on a laptop, on its own row on a phone). The image tab has one too.
The truth is the demo dataset's record of each picture (demo/dataset.py), matched by caption."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from typer.testing import CliRunner

from api.app import create_app
from api.config import Settings
from cli.main import build_cli
from demo import dataset, vocabulary
from demo.gallery import GALLERY_SEED, GALLERY_SIZE, describe
from retrieval.config import SHIPPED_MODEL_DIR
from tests.support.browser_support import PageLog, open_page, screenshot
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[int, vocabulary.Attributes]]]:
    """A live server on the demo gallery, and item id -> the attributes the picture was drawn with."""
    data_dir = tmp_path_factory.mktemp("exclude-browser")
    env = {"CNCLIP_DATA_DIR": str(data_dir), "CNCLIP_PROVIDER": "cpu", "CNCLIP_MODEL_DIR": str(SHIPPED_MODEL_DIR)}
    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread; the demo runs its own
        result = pool.submit(CliRunner().invoke, build_cli(), ["demo", "--no-serve"], env=env).result()
    assert result.exit_code == 0, result.output
    truth = {describe(s.attributes): s.attributes for s in dataset.demo_gallery(GALLERY_SIZE, GALLERY_SEED)}
    settings = Settings(_env_file=None, data_dir=data_dir, model_dir=SHIPPED_MODEL_DIR, provider="cpu")
    with LiveServer(create_app(settings)) as live:
        with httpx.Client(base_url=live.base_url) as client:
            items = {i: client.get(f"/v1/items/{i}").json() for i in range(1, GALLERY_SIZE + 1)}
        yield live.base_url, {i: truth[item["caption"]] for i, item in items.items()}


@pytest.fixture
def page(browser: Browser, server: tuple[str, dict], width: int, log: PageLog) -> Iterator[Page]:
    pg = open_page(browser, server[0] + "/", width, log)
    expect(pg.locator("#collection option")).not_to_have_count(0)
    yield pg
    pg.context.close()
    log.assert_clean()


def shown(page: Page, view: str) -> list[int]:
    cards = page.locator(f"#panel-{view} .results .card")
    return [int(i) for i in cards.evaluate_all("cards => cards.map(c => c.dataset.id)")]


def test_the_exclude_field_takes_red_out_of_the_stars(page: Page, server: tuple[str, dict], width: int) -> None:
    truth = server[1]
    page.uncheck("#cutoff")  # every result, so the counts are the API's top 48
    page.select_option("#k", "48")
    page.fill("#query", "星星")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    expect(cards).to_have_count(48)
    before = [truth[i] for i in shown(page, "text")]
    assert (sum(a.colour == "红色" for a in before), sum(a.shape == "星形" for a in before)) == (5, 44)  # 5 red stars

    field = page.locator("#exclude")
    expect(field).to_be_visible()
    assert field.get_attribute("placeholder", timeout=1000).startswith("不要")
    field.fill("红色， 红色")  # a full-width comma; a repeat counts once
    with page.expect_request("**/v1/search/text") as request:
        field.press("Enter")  # Enter in either field searches
    assert json.loads(request.value.post_data or "{}")["exclude"] == ["红色"]
    expect(page.locator("#panel-text .status")).to_be_hidden()
    expect(cards).to_have_count(48)
    after = [truth[i] for i in shown(page, "text")]
    assert sum(a.colour == "红色" for a in after) == 0
    assert sum(a.shape == "星形" for a in after) == 39  # every star that is not red
    expect(page.locator("#panel-text .results-title")).to_contain_text("“星星”，不要“红色”")

    # It fits: inside the page, not over the query; beside it at 1280 px, on its own row at 390 px.
    query, box = page.locator("#query").bounding_box(), field.bounding_box()
    assert query is not None and box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= width and box["width"] >= 120
    if width >= 1000:
        assert abs(box["y"] - query["y"]) < 4 and box["x"] >= query["x"] + query["width"]
    else:
        assert box["y"] >= query["y"] + query["height"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    screenshot(page, f"exclude_{width}")

    field.fill("")  # cleared: the plain search again
    with page.expect_request("**/v1/search/text") as request:
        page.click("#search-button")
    assert "exclude" not in json.loads(request.value.post_data or "{}")


def test_the_image_tab_has_an_exclude_field_that_is_sent(page: Page, server: tuple[str, dict], width: int) -> None:
    base, truth = server
    red_star = next(i for i, a in truth.items() if a.shape == "星形" and a.colour == "红色")
    data = httpx.get(f"{base}/v1/items/{red_star}/image").content
    page.click("#tab-image")
    page.fill("#image-exclude", "红色")
    with page.expect_request("**/v1/search/image") as request:  # picking the picture searches
        page.set_input_files("#image-file", files=[{"name": "q.png", "mimeType": "image/png", "buffer": data}])
    assert 'name="exclude"\r\n\r\n红色' in (request.value.post_data_buffer or b"").decode("utf-8", "replace")
    expect(page.locator("#panel-image .results .card").first).to_be_visible()
    box = page.locator("#image-exclude").bounding_box()
    assert box is not None and box["x"] + box["width"] <= width
    red = [i for i in shown(page, "image") if truth[i].colour == "红色" and i != red_star]
    assert red == []  # only the query picture itself may stay (cosine 1)
