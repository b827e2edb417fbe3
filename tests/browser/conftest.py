"""Fixtures of the browser tests: one Chromium per module, each page width in turn, a page log, and the
UI's main page on the module's own `server` (each module starts one, seeded for what it shows; a module
that needs another page defines its own `page`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser_support import WIDTHS, PageLog, Server, launch_browser, open_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch_browser()


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def width(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def log() -> PageLog:
    return PageLog()


@pytest.fixture
def page(browser: Browser, server: Server, width: int, log: PageLog) -> Iterator[Page]:
    """The UI at `width`, once it lists the collections; after the test, nothing it logged may have failed."""
    pg = open_page(browser, server.base + "/", width, log)
    expect(pg.locator("#collection option")).not_to_have_count(0)
    yield pg
    pg.context.close()
    log.assert_clean()
