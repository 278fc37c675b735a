"""The API's server spans, read from an in-memory exporter: a request is named by its route
template, never by its path, since some paths are credentials."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from genhook import tracing
from tests.conftest import make_harness, make_settings
from tests.support.images import data_url

OUTPUT_ROUTE = "/api/v1/outputs/{key:path}"


async def test_server_spans_name_the_route_never_a_capability_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output's URL is its own credential: a span that recorded the request's path would
    hand every account's outputs to whoever reads the traces."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("genhook"))
    harness = await make_harness(make_settings(tmp_path, f"sqlite+aiosqlite:///{tmp_path}/t.db"))
    try:
        body = {"model": "test/fake-edit", "prompt": "edit", "images": [data_url()]}
        submitted = await harness.submit(body)
        assert submitted.status_code == 200, submitted.text
        assert await harness.run_all() == 1
        task_id = submitted.json()["id"]
        url = (await harness.result(task_id))["outputs"][0]
        key = url.split("/api/v1/outputs/", 1)[1]
        assert (await harness.client.get(f"/api/v1/outputs/{key}")).status_code == 200
        await harness.client.post("/api/v1/upstream/callback/secret-token-123", json={})
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
    spans = exporter.get_finished_spans()
    output = [s for s in spans if (s.attributes or {}).get("http.route") == OUTPUT_ROUTE]
    assert output and output[0].name == f"GET {OUTPUT_ROUTE}"
    secret = key.rsplit("/", 1)[-1]
    for span in spans:
        text = span.name + repr(dict(span.attributes or {}))
        assert secret not in text, text
        assert "secret-token-123" not in text, text
