"""The OpenAPI document says what the API does: every status an endpoint answers is listed,
a request the schema allows is not refused for a rule the schema could have stated, and a
405 lists every method its path accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness, make_harness, make_settings

ADMIN_PATHS = ["/api/v1/admin/results", "/api/v1/admin/deliveries", "/api/v1/admin/destinations"]


@pytest.fixture
async def h(tmp_path: Path) -> Any:
    harness = await make_harness(make_settings(tmp_path, f"sqlite+aiosqlite:///{tmp_path}/t.db"))
    yield harness
    await harness.client.aclose()
    await harness.state.db.dispose()


def _document(h: Harness) -> dict[str, Any]:
    app = h.client._transport.app  # type: ignore[attr-defined]
    document: dict[str, Any] = app.openapi()
    return document


@pytest.mark.parametrize("path", ADMIN_PATHS)
async def test_admin_endpoints_document_their_403(h: Harness, path: str) -> None:
    answer = await h.client.get(path, headers=h.headers)
    assert answer.status_code == 403, answer.text
    assert "403" in _document(h)["paths"][path]["get"]["responses"]


async def test_the_listing_limit_schema_states_its_range(h: Harness) -> None:
    parameters = _document(h)["paths"]["/api/v1/model/results"]["get"]["parameters"]
    limit = next(p["schema"] for p in parameters if p["name"] == "limit")
    assert (limit["minimum"], limit["maximum"]) == (1, 100)
    for value, status in (("0", 400), ("1", 200), ("100", 200), ("101", 400)):
        answer = await h.client.get(f"/api/v1/model/results?limit={value}", headers=h.headers)
        assert answer.status_code == status, (value, answer.text)


@pytest.mark.parametrize("since", ["2026-01-02T03:04:05z", "2026-01-02t03:04:05+01:00"])
async def test_a_date_time_the_schema_allows_is_accepted(h: Harness, since: str) -> None:
    document = _document(h)
    bulk = document["components"]["schemas"]["BulkRedelivery"]["properties"]["since"]
    assert bulk["format"] == "date-time"
    answer = await h.client.post(
        "/api/v1/webhooks/deliveries/redeliver", json={"since": since}, headers=h.headers
    )
    assert answer.status_code == 200, answer.text
    listing = await h.client.get(
        "/api/v1/model/results", params={"since": since}, headers=h.headers
    )
    assert listing.status_code == 200, listing.text


async def test_image_items_schema_says_what_an_item_is(h: Harness) -> None:
    schemas = _document(h)["components"]["schemas"]
    request = next(v for k, v in schemas.items() if k.startswith("test_fake-edit"))
    assert request["properties"]["images"]["items"]["pattern"].startswith("^(")


@pytest.mark.parametrize(("method", "path"), [("DELETE", "/api/v1/keys"), ("PUT", "/api/v1/keys")])
async def test_a_405_lists_every_method_of_the_path(h: Harness, method: str, path: str) -> None:
    answer = await h.client.request(method, path, headers=h.headers)
    assert answer.status_code == 405
    allowed = {m.strip() for m in answer.headers["Allow"].split(",")}
    declared = {m.upper() for m in _document(h)["paths"][path]}
    assert declared <= allowed, (declared, allowed)
    assert answer.json()["message"] == f"{method} is not allowed on this endpoint"
