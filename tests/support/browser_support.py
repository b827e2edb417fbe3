"""Shared by the browser tests: a real uvicorn server on a free port (FakeEncoder + the real
catalog, seeded through the API), Debian's Chromium via Playwright, and pages that

- cannot reach anything but the loopback server (every other request is aborted and recorded),
- are served under a strict Content-Security-Policy (added by the test to every document: `UI_CSP`,
  or `DOCS_CSP` for /docs and /redoc), so an inline script, inline handler or external asset shows
  up as a violation,
- fail the test on any JavaScript error, CSP violation or failed (4xx/5xx) request.

Each test saves screenshots into tests/artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
import uvicorn
from playwright.sync_api import Browser, Page, Request, Route, expect, sync_playwright

from api import create_app
from api.config import Settings
from api.request_guard import APP_CSP, DOCS_CSP
from indexer.service.ports import Catalog
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import GALLERY, image_bytes, open_test_catalog

# The CI machine is small and shared: give each UI expectation more than Playwright's default 5 s.
expect.set_options(timeout=20_000)

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TEXTS = ["一只猫在沙发上睡觉", "草地上奔跑的小狗", "城市街道上的黄色出租车", "夕阳下的海滩", "雪山和蓝天"]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
WIDTHS = [1280, 390]  # a laptop, a phone: the `width` fixture (tests/browser/conftest.py) runs each
# The pages must work under the policies the server sends (api/request_guard.py): nothing but our own
# origin; the UI previews the chosen image from a blob: URL; the docs pages need inline <style> (ReDoc),
# data: icons and a blob: worker (ReDoc's search).
UI_CSP = APP_CSP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gallery_image(color: tuple[int, int, int]) -> bytes:
    return image_bytes(color, size=(320, 240), fmt="JPEG")


@dataclass
class Server:
    base: str
    ids: dict[str, int]  # caption -> item id


def run_server(data_dir: Path, model_dir: Path, prepare: Callable[[Catalog], None] | None = None) -> Iterator[Server]:
    """uvicorn in a thread, seeded with `photos` (GALLERY), `sentences` (TEXTS) and `empty`; `prepare`
    may add to the catalog first (collections with vectors of its choosing)."""
    settings = Settings(_env_file=None, model_dir=model_dir, data_dir=data_dir, provider="cpu")
    catalog = open_test_catalog(settings)
    if prepare is not None:
        prepare(catalog)
    port = _free_port()
    config = uvicorn.Config(
        create_app(settings, encoder=FakeEncoder(), catalog=catalog), host="127.0.0.1", port=port, log_level="warning"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    ids: dict[str, int] = {}
    with httpx.Client(base_url=base) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        for caption, tags, color in GALLERY:
            r = client.post(
                "/v1/collections/photos/items",
                files={"file": ("p.jpg", gallery_image(color), "image/jpeg")},
                data={"caption": caption, "tags": json.dumps(tags)},
            )
            assert r.status_code == 201, r.text
            ids[caption] = r.json()["id"]
        assert client.post("/v1/collections", json={"name": "sentences", "kind": "texts"}).status_code == 201
        assert client.post("/v1/collections/sentences/texts", json={"texts": TEXTS}).status_code == 201
        assert client.post("/v1/collections", json={"name": "empty", "kind": "images"}).status_code == 201
    try:
        yield Server(base, ids)
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        catalog.close()


def launch_browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclass
class PageLog:
    """What went wrong on a page; `assert_clean` fails the test on any of it."""

    blocked: list[str] = field(default_factory=list)  # non-loopback requests, aborted
    errors: list[str] = field(default_factory=list)  # uncaught JavaScript errors
    console_errors: list[str] = field(default_factory=list)  # incl. CSP violations
    failed: list[str] = field(default_factory=list)  # responses >= 400 the test did not expect
    allow_status: set[int] = field(default_factory=set)
    known_console: tuple[str, ...] = ()  # substrings of console errors a test expects

    def assert_clean(self) -> None:
        assert not self.blocked, f"requests left the machine: {self.blocked}"
        assert not self.errors, f"JavaScript errors: {self.errors}"
        assert not self.console_errors, f"console errors: {self.console_errors}"
        assert not self.failed, f"failed requests: {self.failed}"


def csp_for(url: str) -> str:
    return DOCS_CSP if urlparse(url).path in ("/docs", "/redoc") else UI_CSP


def open_page(browser: Browser, url: str, width: int, log: PageLog) -> Page:
    """A fresh context at `width` px that reaches only loopback hosts and serves each document
    under its policy (`csp_for`); `log` collects what went wrong."""
    context = browser.new_context(viewport={"width": width, "height": 900}, locale="zh-CN")

    def handle(route: Route, request: Request) -> None:
        if urlparse(request.url).hostname not in LOOPBACK:
            log.blocked.append(request.url)
            route.abort("blockedbyclient")
        elif request.resource_type == "document":
            # The server's own policy, and it must be at least as strict as the one the page is written for.
            response = route.fetch()
            served = response.headers.get("content-security-policy")
            assert served == csp_for(request.url), f"{request.url} is served under {served!r}"
            route.fulfill(response=response)
        else:
            route.continue_()

    context.route("**/*", handle)
    page = context.new_page()
    page.on("pageerror", lambda exc: log.errors.append(str(exc)))

    def on_console(msg: object) -> None:
        text = str(getattr(msg, "text", ""))
        # A failed load is logged by Chromium too; the response check below judges those.
        if getattr(msg, "type", "") != "error" or any(k in text for k in log.known_console):
            return
        if not text.startswith("Failed to load resource"):
            log.console_errors.append(text)

    page.on("console", on_console)

    def on_response(response: object) -> None:
        status = getattr(response, "status", 0)
        if status >= 400 and status not in log.allow_status:
            log.failed.append(f"{status} {getattr(response, 'url', '')}")

    page.on("response", on_response)
    page.goto(url)
    return page


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
