"""Traces across the service's real processes: ``genhook serve`` (api, worker and dispatcher
each a process of its own) on SQLite and PostgreSQL, with the SDK's in-memory exporter in every
process (``tests/support/spans``), and against a real OTLP receiver on loopback, over HTTP and
over gRPC, with the exporters as an operator configures them through ``OTEL_*``."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, LiveService, live_database, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.otlp import OtlpGrpcCollector, OtlpHttpCollector
from tests.support.webhook_receiver import Receiver, sequence

MODEL = "test/fake-edit"
PROMPT = "steps=2 violet-elephant-secret-prompt"
SPANS_SITE = ROOT / "tests" / "support" / "spans"


def _traced_env(spans: Path) -> dict[str, str]:
    return {
        "GENHOOK_TEST_SPANS": str(spans),
        "PYTHONPATH": os.pathsep.join(
            [str(SPANS_SITE), str(ROOT / "src"), os.environ["PYTHONPATH"]]
        ),
        "GENHOOK_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    }


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def traced(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveService, Path]]:
    tmp = tmp_path_factory.mktemp("traced")
    spans = tmp / "spans.jsonl"
    live = start_service(tmp, live_database(request), **_traced_env(spans))
    yield live, spans
    stop_service(live)


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _wait_spans(path: Path, trace_id: str, ready: Any, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [s for s in _spans(path) if s["trace_id"] == trace_id]
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


async def test_a_task_is_one_trace_across_api_worker_and_dispatcher(
    traced: tuple[LiveService, Path],
) -> None:
    live, path = traced
    receiver = await Receiver(sequence(500, 200)).start()
    try:
        trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
        async with httpx.AsyncClient(base_url=live.base_url, timeout=30) as http:
            answer = await http.post(
                "/api/v1/model/generateImage",
                headers={
                    "Authorization": f"Bearer {live.api_key}",
                    "traceparent": f"00-{trace_id}-{caller}-01",
                },
                json={
                    "model": MODEL,
                    "prompt": PROMPT,
                    "images": [data_url()],
                    "size": "1024*1024",
                    "webhook_url": f"http://127.0.0.1:{receiver.port}/hook",
                },
            )
            assert answer.status_code == 200, answer.text
            task_id = answer.json()["id"]
            await receiver.wait_for(2, timeout=30)
    finally:
        await receiver.stop()

    def complete(found: list[dict[str, Any]]) -> bool:
        return sum(s["name"] == "POST" and s["kind"] == "CLIENT" for s in found) >= 2

    found = _wait_spans(path, trace_id, complete)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in found:
        by_name.setdefault(span["name"], []).append(span)
    assert set(by_name) >= {
        "POST /api/v1/model/generateImage",
        "genhook.task.queued",
        "genhook.task.run",
        "genhook.engine.run",
        "genhook.blob.put",
        "POST",
    }, sorted(by_name)

    # The submit request continues the caller's trace and names the task.
    (submit,) = by_name["POST /api/v1/model/generateImage"]
    assert submit["kind"] == "SERVER" and submit["parent_id"] == caller
    assert submit["attributes"]["http.request.method"] == "POST"
    assert submit["attributes"]["http.route"] == "/api/v1/model/generateImage"
    assert submit["attributes"]["http.response.status_code"] == 200
    assert submit["attributes"]["genhook.task.id"] == task_id

    # The worker, another process, continues it from the stored context.
    (queued,) = by_name["genhook.task.queued"]
    (run,) = by_name["genhook.task.run"]
    assert queued["parent_id"] == run["parent_id"] == submit["span_id"]
    assert queued["start"] <= queued["end"] <= run["start"]
    assert run["pid"] != submit["pid"]
    (engine,) = by_name["genhook.engine.run"]
    assert engine["parent_id"] == run["span_id"] and engine["pid"] == run["pid"]
    steps = [e for e in engine["events"] if e["name"] == "genhook.engine.step"]
    assert [e["attributes"]["genhook.progress"] for e in steps] == [0.5, 1.0]
    (blob,) = by_name["genhook.blob.put"]
    assert blob["parent_id"] == run["span_id"] and blob["attributes"]["genhook.blob.bytes"] > 0

    # Every webhook attempt, from the dispatcher, a third process, with its outcome.
    attempts = sorted(by_name["POST"], key=lambda s: s["attributes"]["genhook.webhook.attempt"])
    assert [a["attributes"]["genhook.webhook.attempt"] for a in attempts] == [1, 2]
    assert [a["attributes"]["http.response.status_code"] for a in attempts] == [500, 200]
    assert [a["status"] for a in attempts] == ["ERROR", "UNSET"]
    for attempt in attempts:
        assert attempt["kind"] == "CLIENT" and attempt["parent_id"] == submit["span_id"]
        assert attempt["pid"] not in (submit["pid"], run["pid"])
        assert attempt["attributes"]["server.address"] == "127.0.0.1"
        assert attempt["attributes"]["server.port"] == receiver.port
        assert attempt["attributes"]["genhook.task.id"] == task_id

    # The receiver's trace continues from each attempt's span.
    sent = [r.headers["traceparent"] for r in receiver.received]
    assert sent == [f"00-{trace_id}-{a['span_id']}-01" for a in attempts]

    # Nothing the caller sent in confidence is in any attribute or event.
    text = json.dumps([[s["attributes"], s["events"]] for s in found])
    for secret in ("violet-elephant", live.api_key, live.signing_secret, "/hook", "data:image"):
        assert secret not in text


async def test_a_submit_without_traceparent_starts_a_trace(
    traced: tuple[LiveService, Path],
) -> None:
    live, path = traced
    async with httpx.AsyncClient(base_url=live.base_url, timeout=30) as http:
        answer = await http.post(
            "/api/v1/model/generateImage",
            headers={"Authorization": f"Bearer {live.api_key}", "Prefer": "wait=30"},
            json={"model": MODEL, "prompt": "plain", "images": [data_url()], "size": "1024*1024"},
        )
    task_id = answer.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        spans = _spans(path)
        submits = [
            s
            for s in spans
            if s["kind"] == "SERVER" and s["attributes"].get("genhook.task.id") == task_id
        ]
        runs = [s for s in spans if s["name"] == "genhook.task.run"]
        if submits and any(r["trace_id"] == submits[0]["trace_id"] for r in runs):
            assert submits[0]["parent_id"] is None
            return
        time.sleep(0.1)
    raise AssertionError("the task's run never joined its submit's trace")


# -- a real OTLP receiver ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_traces_reach_an_otlp_receiver(tmp_path: Path, protocol: str) -> None:
    collector = OtlpGrpcCollector() if protocol == "grpc" else OtlpHttpCollector()
    endpoint = collector.endpoint
    live: LiveService | None = None
    try:
        live = start_service(
            tmp_path,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_SERVICE_NAME="genhook-under-test",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        trace_id = secrets.token_hex(16)
        answer = HTTP.post(
            f"{live.base_url}/api/v1/model/generateImage",
            headers={
                "Authorization": f"Bearer {live.api_key}",
                "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
                "Prefer": "wait=30",
            },
            json={"model": MODEL, "prompt": "plain", "images": [data_url()], "size": "1024*1024"},
            timeout=60,
        )
        assert answer.json()["status"] == "completed", answer.text
        deadline = time.monotonic() + 30
        names: set[tuple[str, str]] = set()
        while time.monotonic() < deadline:
            names = {
                (resource.get("genhook.role", ""), span.name)
                for resource, span in collector.spans()
                if span.trace_id.hex() == trace_id
            }
            if ("worker", "genhook.engine.run") in names and (
                "api",
                "POST /api/v1/model/generateImage",
            ) in names:
                break
            time.sleep(0.1)
        assert ("api", "POST /api/v1/model/generateImage") in names, names
        assert ("worker", "genhook.task.run") in names
        assert ("worker", "genhook.engine.run") in names
        resources = [resource for resource, _ in collector.spans()]
        assert all(r["service.name"] == "genhook-under-test" for r in resources)
    finally:
        if live is not None:
            stop_service(live)
        collector.close()
