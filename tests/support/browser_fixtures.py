"""The browser tests' shared fixtures, registered for every test module in tests/conftest.py: one
Chromium per module, each page width in turn, and a page log. Playwright is imported only when a
test asks for the browser, so the rest of the suite does not load it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from tests.support.browser_support import PageLog

WIDTHS = [1280, 390]  # a laptop, a phone


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from tests.support.browser_support import launch_browser

    yield from launch_browser()


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def width(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def log() -> PageLog:
    from tests.support.browser_support import PageLog

    return PageLog()
