"""The docs pages and the UI's HTML name only same-origin assets and carry no inline script or
inline event handler, so they work offline and under a `script-src 'self'` Content-Security-Policy.
(The browser tests load them for real with the network blocked.)"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from api.docs import DOCS_ASSETS
from tests.support.api_helpers import api_client

PAGES = ["/", "/docs", "/redoc"]


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with api_client(settings) as c:
        yield c


@pytest.mark.parametrize("page", PAGES)
def test_pages_load_only_same_origin_assets_and_no_inline_script(client: TestClient, page: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    urls = [u for u in re.findall(r'(?:src|href)="([^"]*)"', html) if not u.startswith("#")]  # in-page links
    assert urls and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    assert "/static/favicon.svg" in urls
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script>"
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    assert not re.search(r"<style|\sstyle=", html), "inline style"
    for url in urls:  # every asset the page names is served
        assert client.get(url).status_code == 200, url


def test_docs_assets_come_from_the_installed_package(client: TestClient) -> None:
    for name, kind in [
        ("swagger-ui-bundle.js", "javascript"),
        ("swagger-ui.css", "css"),
        ("redoc.standalone.js", "javascript"),
    ]:
        assert (DOCS_ASSETS / name).is_file()
        r = client.get(f"/static-docs/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
        assert r.content == (DOCS_ASSETS / name).read_bytes()


def test_favicon_is_served(client: TestClient) -> None:
    for path in ("/favicon.ico", "/static/favicon.svg"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
        assert r.text.startswith("<svg")
