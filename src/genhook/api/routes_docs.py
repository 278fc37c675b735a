"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), from assets shipped in the package.

FastAPI's own pages load their scripts from a CDN and start them with an inline script, on
the console's origin, where a compromised or swapped CDN file could act with a signed-in
session. Here the scripts come from the ``fastapi-offline`` package and this package, and
the pages carry the console's Content-Security-Policy, widened only where the two
libraries need it: inline styles (both set style attributes) and ReDoc's search worker,
which starts from a ``blob:`` URL. ``GENHOOK_API_DOCS=false`` turns both pages off.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/api-docs/assets"
START = "/api-docs/start"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; worker-src blob:; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

_SWAGGER = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>genhook API - Swagger UI</title>
<link rel="stylesheet" href="{ASSETS}/swagger-ui.css">
<link rel="icon" href="{ASSETS}/favicon.png"></head>
<body><div id="swagger-ui"></div>
<script src="{ASSETS}/swagger-ui-bundle.js"></script>
<script src="{START}/swagger.js"></script>
</body></html>
"""

_REDOC = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>genhook API - ReDoc</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="{ASSETS}/favicon.png"></head>
<body><redoc spec-url="/openapi.json"></redoc>
<script src="{ASSETS}/redoc.standalone.js"></script>
</body></html>
"""


def install_docs(app: FastAPI) -> None:
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount(ASSETS, StaticFiles(directory=assets), name="api-docs-assets")
    start = Path(__file__).parent / "docs_static"
    app.mount(START, StaticFiles(directory=start), name="api-docs-start")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(_SWAGGER, headers=HEADERS)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return HTMLResponse(_REDOC, headers=HEADERS)
