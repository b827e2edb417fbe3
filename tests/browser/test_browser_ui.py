"""What a user sees, at 1280 px and 390 px, in Chromium with the network blocked and a strict CSP:
each tab owns its results, classification runs on the button (not on a file pick), empty queries
say so, errors read in Chinese with the API's message as a detail, tabs stay on one line, the
favicon loads, TIFF can be picked, and results name their files."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import Page, Route, expect

from tests.support.api_helpers import GALLERY, image_bytes
from tests.support.browser_support import (
    PageLog,
    Server,
    gallery_image,
    run_server,
    screenshot,
)

pytestmark = pytest.mark.browser
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[Server]:
    yield from run_server(tmp_path_factory.mktemp("browser-ui"), toy_model_dir)


def visible_cards(page: Page) -> list[str]:
    """data-id of every result card the user can see, whichever view it belongs to."""
    return page.locator(".results .card:visible").evaluate_all("cards => cards.map(c => c.dataset.id)")


def api_calls(page: Page, path: str) -> list[str]:
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url) if r.url.split("?")[0].endswith(path) else None)
    return calls


def test_each_tab_owns_its_results(page: Page, width: int) -> None:
    page.fill("#query", "穿红色裙子的女孩")
    page.click("#search-button")
    expect(page.locator("#panel-text .results .card")).to_have_count(len(GALLERY))
    text_results = visible_cards(page)

    page.click("#tab-image")  # nothing searched here yet: no results at all on screen
    expect(page.locator("#panel-image")).to_be_visible()
    assert visible_cards(page) == [] and page.locator(".results-title:visible").count() == 0
    page.set_input_files(
        "#image-file", files=[{"name": "q.jpg", "mimeType": "image/jpeg", "buffer": gallery_image(GALLERY[2][2])}]
    )
    expect(page.locator("#panel-image .results .card")).to_have_count(len(GALLERY))
    page.check("input[name=target][value=texts]")
    expect(page.locator("#panel-image .results .text-card")).to_have_count(5)
    screenshot(page, f"tabs_image_{width}")

    page.click("#tab-classify")  # the text cards of the image tab stay in their tab
    assert visible_cards(page) == [] and page.locator(".text-card:visible").count() == 0
    expect(page.locator("#probabilities")).to_be_hidden()
    screenshot(page, f"tabs_classify_{width}")

    page.click("#tab-text")  # and the text tab still shows its own search
    assert visible_cards(page) == text_results
    expect(page.locator("#query")).to_have_value("穿红色裙子的女孩")


def test_picking_a_file_does_not_classify_the_button_does(page: Page, width: int) -> None:
    calls = api_calls(page, "/v1/classify")
    page.click("#tab-classify")
    expect(page.locator("#classify-button")).to_be_disabled()  # nothing to classify yet
    page.set_input_files(
        "#classify-file", files=[{"name": "c.png", "mimeType": "image/png", "buffer": image_bytes((90, 60, 30))}]
    )
    expect(page.locator("#classify-drop .file-name")).to_have_text("已选择：c.png")
    expect(page.locator("#classify-button")).to_be_enabled()
    page.wait_for_timeout(500)  # time for a request, had the pick started one
    assert calls == [] and page.locator("#probabilities li").count() == 0
    page.fill("#labels", "猫，狗")
    page.click("#classify-button")
    expect(page.locator("#probabilities li")).to_have_count(2)
    assert len(calls) == 1
    screenshot(page, f"classify_{width}")

    page.fill("#labels", " ,， \n")  # only separators: says so, asks nothing
    page.click("#classify-button")
    expect(page.locator("#panel-classify .error-text")).to_have_text("请至少输入一个候选标签。")
    assert len(calls) == 1 and page.locator("#probabilities li").count() == 0


@pytest.mark.parametrize("query", ["", "   \u3000 "], ids=["empty", "whitespace"])
def test_an_empty_query_says_so(page: Page, width: int, query: str) -> None:
    calls = api_calls(page, "/v1/search/text")
    page.fill("#query", query)
    page.press("#query", "Enter")
    error = page.locator("#panel-text .error")
    expect(error).to_be_visible()
    expect(error.locator(".error-text")).to_have_text("请输入要搜索的文字。")
    expect(error.locator(".error-detail")).to_be_hidden()
    assert calls == [] and visible_cards(page) == []
    expect(page.locator("#query")).to_be_focused()
    screenshot(page, f"empty_query_{width}")


def fake_error(code: str, message: str, status: int) -> object:
    def handle(route: Route) -> None:
        route.fulfill(
            status=status,
            content_type="application/json",
            body=json.dumps({"error": {"code": code, "message": message}}),
        )

    return handle


CODES = [
    ("unauthorized", 401, "API 密钥"),
    ("overloaded", 429, "服务繁忙"),
    ("payload_too_large", 413, "图片太大"),
    ("image_too_large", 422, "图片太大"),
    ("invalid_input", 422, "输入不符合要求"),
    ("encoder_unavailable", 503, "模型正在加载"),
    ("database_unavailable", 503, "数据库暂时不可用"),
    ("internal_error", 500, "服务器内部错误"),
    ("some_future_code", 418, "请求失败"),  # a code the UI does not know yet: still Chinese
]


def test_api_errors_read_in_chinese_with_the_api_message_as_detail(page: Page, width: int, log: PageLog) -> None:
    log.allow_status |= {status for _, status, _ in CODES}
    error = page.locator("#panel-text .error")
    page.fill("#query", "猫")
    for code, status, chinese in CODES:
        message = f"the server says {code}"
        page.route("**/v1/search/text", fake_error(code, message, status))
        page.click("#search-button")
        expect(error.locator(".error-text")).to_contain_text(chinese)
        assert CJK.search(error.locator(".error-text").inner_text())
        assert message not in error.locator(".error-text").inner_text()
        expect(error.locator(".error-detail")).to_contain_text(f"详情：{message}")
        expect(error.locator(".error-detail")).to_contain_text(f"HTTP {status}，{code}")
        page.unroute("**/v1/search/text")
    screenshot(page, f"error_detail_{width}")

    page.route("**/v1/search/text", lambda route: route.abort("connectionrefused"))
    page.click("#search-button")
    expect(error.locator(".error-text")).to_have_text("无法连接服务器，请检查网络或服务是否在运行。")
    expect(error.locator(".error-detail")).to_be_hidden()


def test_an_image_with_too_many_pixels_reads_too_large_with_the_limit(page: Page, width: int, log: PageLog) -> None:
    """An 81 Mpx upload read "无法识别" (cannot recognise): the API's `image_too_large` reads 图片太大 and the limit."""
    log.allow_status.add(422)
    message = "the image is 9000×9000 pixels; the limit is 80,000,000 pixels"
    page.route("**/v1/search/text", fake_error("image_too_large", message, 422))
    page.fill("#query", "猫")
    page.click("#search-button")
    text = page.locator("#panel-text .error .error-text")
    expect(text).to_contain_text("图片太大")
    expect(text).to_contain_text("上限 80,000,000 像素")
    assert "无法识别" not in text.inner_text()


def test_a_bad_label_set_name_is_explained_in_chinese(page: Page, width: int, log: PageLog) -> None:
    log.allow_status.add(422)
    page.click("#tab-classify")
    page.once("dialog", lambda dialog: dialog.accept("坏 名字!"))
    page.click("#save-label-set")
    error = page.locator("#panel-classify .error")
    expect(error.locator(".error-text")).to_contain_text("标签集名称只能包含字母、数字、汉字和 _ - .")
    expect(error.locator(".error-detail")).to_contain_text("invalid_input")  # the API's words, as a detail
    screenshot(page, f"label_set_error_{width}")


def test_a_missing_item_is_explained_in_chinese(page: Page, server: Server, width: int, log: PageLog) -> None:
    log.allow_status.add(404)
    page.goto(server.base + "/#/item/999999")
    error = page.locator("#item-view .error")
    expect(error.locator(".error-text")).to_have_text("没有找到这张图片，它可能已被删除。")
    expect(error.locator(".error-detail")).to_contain_text("999999")
    expect(page.locator("#tabs")).to_be_hidden()
    page.click("#back")
    expect(page.locator("#tabs")).to_be_visible()
    expect(page.locator("#item-view")).to_be_hidden()


def test_tabs_fit_on_one_line(page: Page, width: int) -> None:
    boxes = page.locator('[role="tab"]').evaluate_all(
        """tabs => tabs.map(t => {
            const r = t.getBoundingClientRect();
            return {right: r.right, lineHeight: parseFloat(getComputedStyle(t).lineHeight), text: t.innerText,
                    contentHeight: r.height - parseFloat(getComputedStyle(t).paddingTop) - parseFloat(getComputedStyle(t).paddingBottom)
                                   - parseFloat(getComputedStyle(t).borderBottomWidth)};
        })"""
    )
    assert len(boxes) == 3
    for box in boxes:
        assert box["contentHeight"] < 1.5 * box["lineHeight"], f"{box['text']} wraps: {box}"
        assert box["right"] <= width, f"{box['text']} runs off the screen: {box}"
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
    screenshot(page, f"tabs_{width}")


def test_the_favicon_loads(page: Page, server: Server, width: int) -> None:
    href = page.locator('link[rel="icon"]').get_attribute("href")
    assert href == "/static/favicon.svg"
    for path in (href, "/favicon.ico"):
        r = page.request.get(server.base + path)
        assert r.ok and r.headers["content-type"] == "image/svg+xml"
    # Chromium draws it: the SVG decodes to an image of its declared size.
    assert page.evaluate(
        """async (src) => { const i = new Image(); i.src = src; await i.decode(); return i.naturalWidth > 0; }""", href
    )


def test_a_tiff_can_be_picked_and_searched(page: Page, server: Server, width: int) -> None:
    accept = page.locator("#image-file").get_attribute("accept") or ""
    assert "image/tiff" in accept.split(",") and ".tif" in accept.split(",")
    assert "image/tiff" in (page.locator("#classify-file").get_attribute("accept") or "").split(",")
    buf = io.BytesIO()
    Image.open(io.BytesIO(gallery_image(GALLERY[1][2]))).save(buf, "TIFF")
    page.click("#tab-image")
    page.set_input_files(
        "#image-file", files=[{"name": "scan.tiff", "mimeType": "image/tiff", "buffer": buf.getvalue()}]
    )
    # The server decoded it (FakeEncoder vectors depend on the bytes, so no identity check here).
    expect(page.locator("#panel-image .results .card")).to_have_count(len(GALLERY))
    expect(page.locator("#panel-image .error")).to_be_hidden()
    expect(page.locator("#image-drop .file-name")).to_have_text("已选择：scan.tiff")
    screenshot(page, f"tiff_{width}")


def with_filenames(route: Route) -> None:
    """The server's answer with `filename`/`path` on the first two results (the first also has a
    caption, the second none) and nothing on the rest, as an API with the fields would send."""
    response = route.fetch()
    body = response.json()
    results = body.get("results", [body])
    results[0].update(filename="IMG_0001.jpg", path="2024/春节/IMG_0001.jpg")
    if len(results) > 1:
        results[1].update(filename="scan 02.tiff", path="scan 02.tiff", caption=None)
        results[2].update(caption=None)
    route.fulfill(response=response, json=body)


def test_results_and_the_item_page_name_their_files(page: Page, server: Server, width: int) -> None:
    page.route("**/v1/search/text", with_filenames)
    page.fill("#query", "红色")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    expect(cards).to_have_count(len(GALLERY))
    first, second, third = cards.nth(0), cards.nth(1), cards.nth(2)
    expect(first.locator(".filename")).to_have_text("IMG_0001.jpg")
    expect(first.locator(".filename")).to_have_attribute("title", "2024/春节/IMG_0001.jpg")
    expect(first.locator(".caption")).to_be_visible()  # the caption too, under the file name
    expect(second.locator(".filename")).to_have_text("scan 02.tiff")
    expect(second.locator(".caption")).to_have_count(0)
    expect(third.locator(".filename")).to_have_count(0)  # neither: says so
    expect(third.locator(".caption")).to_have_text("（无描述）")
    expect(cards.nth(3).locator(".caption")).not_to_have_text("（无描述）")  # caption alone
    screenshot(page, f"filenames_{width}")

    item_id = first.get_attribute("data-id")
    page.route(f"**/v1/items/{item_id}", with_filenames)
    first.locator("a").click()
    expect(page.locator("#item-file")).to_have_text("文件：2024/春节/IMG_0001.jpg")
    expect(page.locator("#item-caption")).not_to_be_empty()
    screenshot(page, f"item_filename_{width}")


def small_pages(route: Route) -> None:
    """Pages of 2 (the UI's smallest page is 12 and the gallery holds 6): the real server pages them."""
    body = json.loads(route.request.post_data or "{}")
    body["k"] = 2
    route.continue_(post_data=json.dumps(body))


def test_the_cutoff_hides_and_says_how_many_sorts_and_loads_more(page: Page, server: Server, width: int) -> None:
    import httpx

    ranked = httpx.post(server.base + "/v1/search/text", json={"query": "红色", "k": 6}).json()["results"]
    cutoff = round((ranked[3]["score"] + ranked[4]["score"]) / 2, 6)  # four above, two below
    above = [str(r["id"]) for r in ranked[:4]]
    page.route("**/v1/search/text", small_pages)
    expect(page.locator("#cutoff")).not_to_be_checked()  # the fake model has no suggested cutoff: all shown
    page.check("#cutoff")
    page.fill("#min-score", str(cutoff))
    page.fill("#query", "红色")
    page.click("#search-button")
    cards = page.locator("#panel-text .results .card")
    title = page.locator("#panel-text .results-title")
    expect(cards).to_have_count(2)
    expect(title).to_contain_text("共 4 条，显示 2 条")
    expect(title).to_contain_text(f"已隐藏 2 条相关度低于 {cutoff} 的结果")
    expect(cards.first.locator(".taken")).to_contain_text("上传于 ")  # uploads without EXIF: their upload date
    page.click("#panel-text button.more")
    expect(cards).to_have_count(4)
    expect(page.locator("#panel-text button.more")).to_have_count(0)  # the last page
    assert visible_cards(page) == above
    screenshot(page, f"cutoff_{width}")

    page.select_option("#sort", "added")  # newest first, among the same four
    page.click("#search-button")
    expect(cards).to_have_count(2)
    page.click("#panel-text button.more")
    expect(cards).to_have_count(4)
    assert visible_cards(page) == sorted(above, key=int, reverse=True)

    page.uncheck("#cutoff")  # no cutoff: every item, nothing hidden
    page.click("#search-button")
    expect(title).not_to_contain_text("已隐藏")
    expect(cards).to_have_count(2)
