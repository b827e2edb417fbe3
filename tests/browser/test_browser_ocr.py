"""Text in photos in Chromium, at 1280 px and 390 px (issue 32): a hybrid search marks the matched words
under each thumbnail, the item page shows the recognised text, and text a photo holds is shown as text
(a sign that says `<img onerror=…>` is not markup)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from indexer.domain.item_texts import RecognisedText, TextLine
from indexer.service.ports import Catalog
from tests.support.browser_support import Server, run_server, screenshot

pytestmark = pytest.mark.browser
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
# caption of a GALLERY picture -> the text recognised in it
TEXTS = {
    "穿红色裙子的女孩": "北京烤鸭\n全聚德 1864",
    "黄色的出租车": f"{HOSTILE}烤鸭外卖",
    "一只黑猫": "会议室 3F",
}


def _recognised(text: str) -> RecognisedText:
    box = ((0.0, 0.0), (9.0, 0.0), (9.0, 4.0), (0.0, 4.0))
    return RecognisedText(tuple(TextLine(line, box, 0.9) for line in text.split("\n")), "test")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[Server]:
    opened: list[Catalog] = []
    for running in run_server(tmp_path_factory.mktemp("browser-ocr"), toy_model_dir, opened.append):
        catalog = opened[0]
        catalog.texts.put_texts("photos", {running.ids[c]: _recognised(t) for c, t in TEXTS.items()})
        catalog.texts.set_ocr("photos", True)
        yield running


def test_matched_words_are_marked_under_the_thumbnails(page: Page, width: int, server: Server) -> None:
    page.fill("#query", "烤鸭")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    expect(cards.first).to_be_visible()
    matched = cards.filter(has=page.locator(".ocr-match"))
    expect(matched).to_have_count(2)
    ids = [int(card.get_attribute("data-id") or 0) for card in matched.all()]
    assert set(ids) == {server.ids["穿红色裙子的女孩"], server.ids["黄色的出租车"]}
    assert [int(c.get_attribute("data-id") or 0) for c in cards.all()[:2]] == ids  # text matches first
    for card in matched.all():
        expect(card.locator(".ocr-match mark")).to_have_text("烤鸭")
    kaoya = cards.filter(has_text="穿红色裙子的女孩").locator(".ocr-match")
    expect(kaoya).to_have_text("北京烤鸭")  # the line holding the match, not the whole text
    hostile = cards.filter(has_text="黄色的出租车").locator(".ocr-match")
    expect(hostile).to_have_text(f"…{HOSTILE[-6:]}烤鸭外卖")  # shown as text, cut before the mark
    expect(hostile).to_have_attribute("title", f"图中文字：{HOSTILE}烤鸭外卖")
    expect(hostile.locator("img")).to_have_count(0)
    assert page.title() != "pwned"
    for card in matched.all():  # the line stays inside its card at both widths
        box, line = card.bounding_box(), card.locator(".ocr-match").bounding_box()
        assert box is not None and line is not None
        assert line["x"] >= box["x"] and line["x"] + line["width"] <= box["x"] + box["width"] + 0.5
    screenshot(page, f"ocr_matches_{width}")


def test_the_item_page_shows_the_recognised_text(page: Page, width: int, server: Server) -> None:
    page.goto(f"{server.base}/#/item/{server.ids['穿红色裙子的女孩']}")
    expect(page.locator("#item-ocr")).to_be_visible()
    expect(page.locator("#item-ocr-text")).to_have_text("北京烤鸭\n全聚德 1864")
    screenshot(page, f"ocr_item_{width}")
    page.goto(f"{server.base}/#/item/{server.ids['黄色的出租车']}")
    expect(page.locator("#item-ocr-text")).to_have_text(f"{HOSTILE}烤鸭外卖")
    expect(page.locator("#item-ocr img")).to_have_count(0)
    page.goto(f"{server.base}/#/item/{server.ids['草地上的小狗']}")  # never read: no text block
    expect(page.locator("#item-meta")).not_to_be_empty()
    expect(page.locator("#item-ocr")).to_be_hidden()
    assert page.title() != "pwned"
