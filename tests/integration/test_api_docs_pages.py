"""``/docs`` and ``/redoc`` load nothing from another origin, run no inline script, and carry
a Content-Security-Policy; ``GENHOOK_API_DOCS=false`` turns them off."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import make_harness, make_settings


async def test_docs_pages_use_packaged_assets_under_a_csp(tmp_path: Path, sqlite_url: str) -> None:
    harness = await make_harness(make_settings(tmp_path, sqlite_url))
    try:
        client = harness.client
        for path in ("/docs", "/redoc"):
            page = await client.get(path)
            assert page.status_code == 200
            csp = page.headers["content-security-policy"]
            assert "script-src 'self';" in csp and "default-src 'none'" in csp
            assert "frame-ancestors 'none'" in csp
            html = page.text
            assert "://" not in html, html
            # Every script is a file of this origin: no inline script for the CSP to allow.
            assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
            for asset in re.findall(r'(?:src|href)="(/[^"]+)"', html):
                fetched = await client.get(asset)
                assert fetched.status_code == 200, asset
                assert fetched.content, asset
        assert (await client.get("/openapi.json")).status_code == 200
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
    harness = await make_harness(make_settings(tmp_path / "off", sqlite_url, api_docs=False))
    try:
        assert (await harness.client.get("/docs")).status_code == 404
        assert (await harness.client.get("/redoc")).status_code == 404
        assert (await harness.client.get("/openapi.json")).status_code == 200
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
