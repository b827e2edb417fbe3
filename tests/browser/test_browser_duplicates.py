"""The duplicates page (#/duplicates) in Chromium at 1280 px and 390 px, network blocked, strict CSP:
groups by tier with the keeper marked and thumbnails that load, pages, selecting members and deleting
them through the item route (the group shrinks, the item is gone), a partial answer offering to go
on, and a refused deletion explained in Chinese."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from indexer.domain.duplicates import FileCopy
from indexer.domain.records import NewImage
from indexer.service.ports import Catalog
from retrieval.fake import FakeEncoder
from tests.support.browser_support import (
    PageLog,
    Server,
    open_page,
    run_server,
    screenshot,
)
from tests.support.indexer_helpers import near, service_for, unit

pytestmark = pytest.mark.browser
SIMILAR_PAIRS = 9  # besides the trio: 12 groups in all, two pages of 10


def library(catalog: Catalog) -> None:
    """`library`: an upload with a copy on disk, a resized pair, a similar trio and SIMILAR_PAIRS pairs."""
    service = service_for(catalog, FakeEncoder())  # type: ignore[arg-type]
    service.create("library", "images")
    rng = np.random.default_rng(11)
    colours = iter((i * 37 % 256, i * 91 % 256, i * 53 % 256) for i in range(1, 200))
    images, vectors = [], []

    def picture(size: tuple[int, int], phash: int, vector: np.ndarray, caption: str) -> None:
        from tests.support.api_helpers import image_bytes

        images.append(NewImage(image_bytes(next(colours), size=size, fmt="JPEG"), caption=caption, phash=phash))
        vectors.append(vector)

    base = unit(rng.standard_normal((3 + SIMILAR_PAIRS, 32)))
    picture((320, 240), 0x1111_1111_1111_1111, base[0], "有副本")
    picture((320, 240), 0x0F0F_0F0F_1234_5678, base[1], "原图")
    picture((160, 120), 0x0F0F_0F0F_1234_5678 ^ 0b11, near(base[1], rng, 0.99), "缩小")
    for i, caption in enumerate(["连拍一", "连拍二", "连拍三"]):
        picture((320 - 40 * i, 240), int(rng.integers(-(2**63), 2**63 - 1)), near(base[2], rng, 0.99), caption)
    for p in range(SIMILAR_PAIRS):
        for k in range(2):
            picture((200, 150), int(rng.integers(-(2**63), 2**63 - 1)), near(base[3 + p], rng, 0.99), f"对{p}-{k}")
    added = service.writes.add_images("library", images, np.stack(vectors))
    sha = catalog.get(added[0].id).sha256 or ""
    root = "/srv/photos"
    service.duplicates.record_copies("library", [FileCopy(sha, f"{root}/2019/副本.jpg", root, 1234, 1.6e9)])
    # The vectors are made up, not the server's model's: store the calibration such a model would have
    # measured (threshold 0.93 between edits at 0.99 and other photos up to 0.87) instead of measuring noise.
    from indexer.service import duplicate_calibration as calibration

    state = catalog.collection("library")
    measured = calibration.decide(state, len(images), np.full(10, 0.99), np.linspace(0.3, 0.9, 10), 10)
    catalog.duplicates.save_calibration(state.id, measured)


@pytest.fixture
def server(tmp_path: Path, toy_model_dir: Path) -> Iterator[Server]:
    yield from run_server(tmp_path / "data", toy_model_dir, prepare=library)


@pytest.fixture
def page(browser: Browser, server: Server, width: int, log: PageLog) -> Iterator[Page]:
    pg = open_page(browser, server.base + "/#/duplicates", width, log)
    yield pg
    pg.context.close()
    log.assert_clean()


def groups(page: Page) -> list[dict[str, object]]:
    return page.locator(".dup-group").evaluate_all(
        """gs => gs.map(g => ({tier: g.dataset.tier, keeper: g.dataset.keeper,
            members: [...g.querySelectorAll('.dup-member')].map(m => m.dataset.id),
            keeperMarked: g.querySelector('.dup-member').classList.contains('keeper')}))"""
    )


def test_groups_by_tier_with_the_keeper_marked_and_pages(page: Page, width: int) -> None:
    expect(page.locator(".dup-group")).to_have_count(10)
    expect(page.locator("#tabs")).to_be_hidden()
    shown = groups(page)
    assert [g["tier"] for g in shown[:3]] == ["identical", "resized", "similar"]
    assert all(g["keeperMarked"] and g["members"][0] == g["keeper"] for g in shown)  # type: ignore[index]
    assert len(shown[2]["members"]) == 3  # type: ignore[arg-type]
    first = page.locator(".dup-group").first
    expect(first.locator(".badge.copy")).to_have_count(1)
    expect(first.locator(".dup-keeper-reason")).to_have_attribute("data-code", "same_bytes")
    reasons = page.locator(".dup-group").nth(1).locator(".dup-keeper-reason")
    expect(reasons).to_have_attribute("data-code", "more_detail")  # 320×240 over its 160×120 copy
    expect(reasons).to_contain_text("建议保留：细节最多")
    expect(first.locator(".dup-member").nth(1).locator(".filename")).to_have_text("2019/副本.jpg")
    expect(first.locator(".dup-member").nth(1).locator(".dup-pick")).to_have_count(0)  # a copy is not an item
    expect(page.locator("#duplicates-view .results-title")).to_contain_text("共 12 组")
    expect(page.locator(".dup-page")).to_have_text("第 1 / 2 页")
    # The first group's thumbnails (in view: the others load lazily as the page scrolls) decode.
    loaded = first.locator(".dup-member img").evaluate_all(
        "imgs => Promise.all(imgs.map(i => i.decode().then(() => i.naturalWidth > 0, () => false)))"
    )
    assert all(loaded)
    screenshot(page, f"duplicates_{width}")
    page.click(".dup-next")
    expect(page.locator(".dup-group")).to_have_count(2)
    expect(page.locator(".dup-page")).to_have_text("第 2 / 2 页")
    expect(page.locator(".dup-next")).to_be_disabled()
    page.select_option("#dup-tier", "resized")
    expect(page.locator(".dup-group")).to_have_count(1)
    assert groups(page)[0]["tier"] == "resized"


def test_selected_members_are_deleted_and_the_group_shrinks(page: Page, server: Server, width: int) -> None:
    page.select_option("#dup-tier", "similar")
    trio = page.locator(".dup-group").first
    expect(trio.locator(".dup-member")).to_have_count(3)
    expect(trio.locator(".dup-delete")).to_be_disabled()
    victim = trio.locator(".dup-member").nth(2)
    victim_id = victim.get_attribute("data-id")
    victim.locator(".dup-pick input").check()
    expect(trio.locator(".dup-delete")).to_have_text("删除所选（1 张）")
    page.once("dialog", lambda dialog: dialog.accept())
    deletes: list[str] = []
    page.on("request", lambda r: deletes.append(r.url) if r.method == "DELETE" else None)
    trio.locator(".dup-delete").click()
    expect(page.locator(".dup-group").first.locator(".dup-member")).to_have_count(2)
    assert deletes == [f"{server.base}/v1/items/{victim_id}"]
    assert page.request.get(f"{server.base}/v1/items/{victim_id}").status == 404
    assert victim_id not in [m for g in groups(page) for m in g["members"]]  # type: ignore[attr-defined]


def test_declining_the_confirmation_deletes_nothing(page: Page, width: int) -> None:
    group = page.locator(".dup-group").nth(2)
    group.locator(".dup-member").nth(1).locator(".dup-pick input").check()
    page.once("dialog", lambda dialog: dialog.dismiss())
    deletes: list[str] = []
    page.on("request", lambda r: deletes.append(r.url) if r.method == "DELETE" else None)
    group.locator(".dup-delete").click()
    page.wait_for_timeout(300)
    assert deletes == []
    expect(page.locator(".dup-group").nth(2).locator(".dup-member")).to_have_count(3)


def test_a_partial_answer_offers_to_go_on(page: Page, width: int) -> None:
    def partial(route: Route) -> None:
        response = route.fetch()
        body = response.json()
        body.update(complete=False, examined=5000, searchable=100000, unhashed=7)
        route.fulfill(response=response, json=body)

    expect(page.locator(".dup-group")).to_have_count(10)  # the first answer is in: only the next is changed
    page.route("**/duplicates?*", partial)
    page.click("#dup-find")
    expect(page.locator(".dup-partial-text")).to_have_text(
        "相似照片尚未查完：已检查 5000 / 100000 张，结果可能还会增加。"
    )
    expect(page.locator(".dup-unhashed")).to_contain_text("有 7 张图片还没有感知哈希")
    page.unroute("**/duplicates?*")
    page.click(".dup-continue")
    expect(page.locator(".dup-partial")).to_be_hidden()
    screenshot(page, f"duplicates_partial_{width}")


def test_a_similar_tier_switched_off_says_why(page: Page, width: int) -> None:
    def off(route: Route) -> None:
        response = route.fetch()
        body = response.json()
        body.update(similar_threshold=None, similar_threshold_source="off")
        body["calibration"].update(threshold=None, reason_code="overlap")
        route.fulfill(response=response, json=body)

    expect(page.locator(".dup-group")).to_have_count(10)
    page.route("**/duplicates?*", off)
    page.click("#dup-find")
    expect(page.locator(".results-title:visible")).to_contain_text("相似照片已关闭：当前模型在这个集合上分不清")
    page.unroute("**/duplicates?*")
    screenshot(page, f"duplicates_similar_off_{width}")


def test_a_refused_deletion_is_explained_in_chinese(page: Page, width: int, log: PageLog) -> None:
    log.allow_status.add(401)

    def refuse(route: Route) -> None:
        if route.request.method != "DELETE":
            route.continue_()
            return
        body = {"error": {"code": "unauthorized", "message": "this request needs the API key"}}
        route.fulfill(status=401, content_type="application/json", body=json.dumps(body))

    page.route("**/v1/items/*", refuse)
    group = page.locator(".dup-group").nth(1)
    group.locator(".dup-member").nth(1).locator(".dup-pick input").check()
    page.once("dialog", lambda dialog: dialog.accept())
    group.locator(".dup-delete").click()
    error = page.locator("#duplicates-view .error")
    expect(error.locator(".error-text")).to_contain_text("API 密钥")
    expect(error.locator(".error-detail")).to_contain_text("HTTP 401，unauthorized")


def test_the_link_opens_the_page_and_back_returns_to_the_tabs(browser: Browser, server: Server, log: PageLog) -> None:
    pg = open_page(browser, server.base + "/", 1280, log)
    try:
        pg.click("#duplicates-link")
        expect(pg.locator("#duplicates-view")).to_be_visible()
        expect(pg.locator(".dup-group")).to_have_count(10)
        pg.locator(".dup-member a").first.click()  # a thumbnail opens the item page
        expect(pg.locator("#item-view")).to_be_visible()
        expect(pg.locator("#duplicates-view")).to_be_hidden()
        pg.go_back()
        expect(pg.locator("#duplicates-view")).to_be_visible()
        pg.click("#dup-back")
        expect(pg.locator("#tabs")).to_be_visible()
        expect(pg.locator("#duplicates-view")).to_be_hidden()
    finally:
        pg.context.close()
    log.assert_clean()
