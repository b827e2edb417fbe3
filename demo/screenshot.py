"""Take the README's screenshot: the web UI searching the demo gallery for "红色的星星".

    cnclip demo --no-serve && python -m demo.screenshot --out docs/screenshot.png

Serves the app (shipped model, the demo data under CNCLIP_DATA_DIR) on a free port in a thread and
drives Debian's Chromium through Playwright.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def take(out: Path, query: str = "红色的星星") -> None:
    """Serve the demo data, search `query` in the UI and save a screenshot to `out`."""
    import uvicorn
    from playwright.sync_api import sync_playwright

    from api.app import create_app
    from api.config import Settings

    settings = Settings()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.1)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_context(viewport={"width": 1280, "height": 860}, locale="zh-CN").new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#collection option", state="attached")
            page.select_option("#collection", "demo")
            page.fill("#query", query)
            page.click("#search-button")
            page.wait_for_selector("#panel-text .results .card")
            # Polled from here: wait_for_function compiles its predicate in the page, which the UI's
            # CSP (no 'unsafe-eval') refuses whenever the first check is not already true.
            images = page.locator("#panel-text .results img")
            while not images.evaluate_all("imgs => imgs.every(i => i.complete && i.naturalWidth > 0)"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the thumbnails did not load")
                time.sleep(0.1)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/screenshot.png"))
    p.add_argument("--query", default="红色的星星")
    args = p.parse_args()
    take(args.out, args.query)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
