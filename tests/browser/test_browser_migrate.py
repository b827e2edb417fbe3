"""The search UI shows a model migration of the chosen collection in progress (a note fed by
GET /v1/collections), in Chromium at 1280 px and 390 px, network blocked, strict CSP; searches of
that collection keep answering with the active model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from indexer.service.ports import Catalog
from retrieval.fake import FakeEncoder
from retrieval.preprocess import read_header
from tests.support.browser_support import PageLog, Server, open_page, run_server, screenshot
from tests.support.indexer_helpers import jpeg
from tests.support.next_model import NewModel

pytestmark = pytest.mark.browser


def half_migrated(catalog: Catalog) -> None:
    """`library` (the default image collection): 4 images, a migration to fake-next stopped at 2 of them."""

    async def fill() -> None:
        encoder = FakeEncoder()
        await encoder.start()
        service = CollectionService(catalog, encoder)
        service.create("library", "images")
        for n in range(4):
            await service.writes.add_upload("library", jpeg(n, (64, 48)), read_header(jpeg(n, (64, 48))))
        with pytest.raises(KeyboardInterrupt):
            await service.migration.migrate("library", NewModel(fail_after=1), MigrateOptions(batch=2))

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API runs an event loop in this thread
        pool.submit(asyncio.run, fill()).result()


@pytest.fixture
def server(tmp_path: Path, toy_model_dir: Path) -> Iterator[Server]:
    yield from run_server(tmp_path / "data", toy_model_dir, prepare=half_migrated)


@pytest.fixture
def page(browser: Browser, server: Server, width: int) -> Iterator[Page]:
    log = PageLog()
    pg = open_page(browser, server.base + "/", width, log)
    yield pg
    pg.context.close()
    log.assert_clean()


def test_a_migration_in_progress_is_shown_and_searches_go_on(page: Page, width: int) -> None:
    note = page.locator("#migration-note")
    expect(page.locator("#collection")).to_have_value("library")
    expect(note).to_be_visible()
    expect(note).to_contain_text("fake-next")
    expect(note).to_contain_text("50%")
    screenshot(page, f"migration-{width}")
    page.fill("#query", "一张照片")
    page.click("#search-button")
    expect(page.locator("#panel-text .card")).to_have_count(4)
    page.select_option("#collection", "photos")
    expect(note).to_be_hidden()
