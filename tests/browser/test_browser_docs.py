"""/docs (Swagger UI) and /redoc (ReDoc) work with no internet: in Chromium with every
non-loopback request aborted and under a strict Content-Security-Policy, both list the API's
operations, and nothing they load fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support.browser_support import WIDTHS, PageLog, Server, open_page, run_server, screenshot

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[Server]:
    yield from run_server(tmp_path_factory.mktemp("browser"), toy_model_dir)


@pytest.mark.parametrize("width", WIDTHS)
def test_swagger_ui_lists_the_operations_offline(browser: Browser, server: Server, width: int) -> None:
    log = PageLog()
    page = open_page(browser, server.base + "/docs", width, log)
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("cnclip-search")
    operations = page.locator(".opblock-summary-path")
    expect(operations.filter(has_text="/v1/search/text")).to_have_count(1)
    paths = set(operations.all_inner_texts())
    assert {"/v1/search/text", "/v1/search/image", "/v1/classify", "/v1/items/{item_id}", "/metrics"} <= {
        p.replace("\u200b", "")
        for p in paths  # Swagger UI puts zero-width spaces into long paths
    }
    # An operation opens and shows its request body schema: the UI is working, not just drawn.
    page.locator(".opblock-summary", has_text="/v1/search/text").first.click()
    expect(page.locator(".opblock-body").first).to_contain_text("query")
    screenshot(page, f"docs_swagger_{width}")
    page.context.close()
    log.assert_clean()


@pytest.mark.parametrize("width", WIDTHS)
def test_redoc_lists_the_operations_offline(browser: Browser, server: Server, width: int) -> None:
    # ReDoc's sidebar shows a "Redocly" logo from its CDN (hard-coded, no option turns it off); it
    # hides itself when the image cannot load. The CSP blocks it before any request leaves, and
    # Chromium reports that: the one console error this page may have.
    log = PageLog(known_console=("https://cdn.redoc.ly/redoc/logo-mini.svg",))
    page = open_page(browser, server.base + "/redoc", width, log)
    expect(page.locator("h1").first).to_contain_text("cnclip-search")
    # ReDoc writes each operation's method and path into its right-hand panel.
    expect(page.get_by_text("/v1/search/text", exact=True).first).to_be_attached()
    for path in ("/v1/search/image", "/v1/classify", "/v1/items/{item_id}/similar"):
        expect(page.get_by_text(path, exact=True).first).to_be_attached()
    screenshot(page, f"docs_redoc_{width}")
    page.context.close()
    log.assert_clean()


def test_the_ui_footer_links_to_working_docs(browser: Browser, server: Server) -> None:
    log = PageLog()
    page = open_page(browser, server.base + "/", 1280, log)
    page.get_by_role("link", name="REST API 文档").click()
    expect(page).to_have_url(server.base + "/docs")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.context.close()
    log.assert_clean()
