"""The API docs pages (`/docs`: Swagger UI, `/redoc`: ReDoc), served with no internet.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so offline they are blank. The assets
come from the `fastapi-offline` wheel (Swagger UI 5 and ReDoc 2, updated by its maintainer and
installed by pip with everything else), which keeps 2.8 MB of minified JavaScript out of this
repository. Its page factory is not used: FastAPI's Swagger page starts the UI with an inline
`<script>`, which a `script-src 'self'` Content-Security-Policy blocks. Our pages carry no inline
script or style; `web/swagger-init.js` starts Swagger UI from a data attribute.
"""

from __future__ import annotations

import html
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.whole_files import WholeFiles

DOCS_ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/static-docs"  # the vendored Swagger UI / ReDoc files
WEB_URL = "/static"  # our own files (web/), where swagger-init.js and the favicon live

_SWAGGER_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} – Swagger UI</title>
<link rel="icon" href="{web}/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{assets}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{openapi}"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{web}/swagger-init.js"></script>
</body>
</html>
"""

_REDOC_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} – ReDoc</title>
<link rel="icon" href="{web}/favicon.svg" type="image/svg+xml">
</head>
<body>
<redoc spec-url="{openapi}"></redoc>
<script src="{assets}/redoc.standalone.js"></script>
</body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """`/docs` and `/redoc` from local assets. The app must be made with `docs_url=None` and
    `redoc_url=None` (FastAPI's CDN pages) and keep its `openapi_url`."""
    if not (DOCS_ASSETS / "swagger-ui-bundle.js").is_file():  # a broken install, not a user error
        raise RuntimeError(f"the API docs assets are missing from {DOCS_ASSETS}; reinstall fastapi-offline")
    app.mount(ASSETS_URL, WholeFiles(StaticFiles(directory=DOCS_ASSETS)), name="docs-assets")  # no ranges

    def render(page: str, request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")  # behind a proxy that strips a prefix
        return HTMLResponse(
            page.format(
                title=html.escape(app.title),
                web=root + WEB_URL,
                assets=root + ASSETS_URL,
                openapi=html.escape(root + str(app.openapi_url)),
            )
        )

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return render(_SWAGGER_PAGE, request)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return render(_REDOC_PAGE, request)
