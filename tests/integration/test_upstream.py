"""The upstream engine against a real model server on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from genhook.db import Task, UsageLine, WebhookDelivery
from genhook.db.models import UpstreamCallback
from genhook.errors import ErrorCode
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url
from tests.support.upstream_server import CREDENTIAL, MP3, UpstreamServer, running_upstream

KEY_ENV = "GENHOOK_TEST_UPSTREAM_KEY"
FAST_RETRY = {"retry_base_seconds": 0.01, "retry_cap_seconds": 0.05, "max_attempts": 3}


def models(base_url: str) -> list[dict[str, Any]]:
    common = {"base_url": base_url, "credential_env": KEY_ENV, **FAST_RETRY}
    return [
        {
            "id": "up/edit",
            "adapter": "openai-images",
            "upstream_model": "gpt-image-1",
            "price_usd": "0.04",
            "cost_pointer": "/usage/cost_usd",
            "nsfw_pointer": "/nsfw",
            "concurrency": 8,
            **common,
        },
        {
            "id": "up/generate",
            "adapter": "openai-images",
            "images_required": False,
            "response_format": "url",
            "detect_nsfw": False,
            **common,
        },
        {
            "id": "up/follow",
            "adapter": "openai-images",
            "follow_redirects": "same-origin",
            "detect_nsfw": False,
            **common,
        },
        {
            "id": "up/slow",
            "adapter": "openai-images",
            "deadline_seconds": 1.5,
            "detect_nsfw": False,
            **common,
        },
        {
            "id": "up/callback",
            "adapter": "queue",
            "detect_nsfw": False,
            "queue": {
                "submit_path": "/queue/submit",
                "submit_body": {"input": {"prompt": "{prompt}"}, "webhook": "{callback_url}"},
                "callback": True,
            },
            **common,
        },
        {
            "id": "up/audio",
            "kind": "audio",
            "adapter": "queue",
            "images_required": False,
            "queue": {
                "submit_path": "/queue/submit",
                "submit_body": {"input": {"prompt": "{prompt}"}, "file": "clip.mp3"},
                "status_path": "/queue/jobs/{id}",
                "poll_interval_seconds": 0.02,
            },
            **common,
        },
        {
            "id": "up/tiny",
            "adapter": "openai-images",
            "max_output_bytes": 100,
            "detect_nsfw": False,
            **common,
        },
        {
            "id": "up/queue",
            "adapter": "queue",
            "detect_nsfw": False,
            "cost_pointer": "/metrics/cost",
            "queue": {
                "submit_path": "/queue/submit",
                "submit_body": {
                    "input": {"prompt": "{prompt}", "image": "{image}", "w": "{width}"}
                },
                "status_path": "/queue/jobs/{id}",
                "poll_interval_seconds": 0.02,
            },
            **common,
        },
    ]


@pytest.fixture
async def upstream(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[UpstreamServer]:
    monkeypatch.setenv(KEY_ENV, CREDENTIAL)
    async with running_upstream() as server:
        yield server


async def open_harness(
    tmp_path: Path, database_url: str, server: UpstreamServer, **overrides: Any
) -> Harness:
    settings = make_settings(
        tmp_path, database_url, upstream_models=models(server.base_url), **overrides
    )
    return await make_harness(settings)


@pytest.fixture
async def h(tmp_path: Path, database_url: str, upstream: UpstreamServer) -> AsyncIterator[Harness]:
    harness = await open_harness(tmp_path, database_url, upstream)
    yield harness
    await harness.worker.close_engines()
    await harness.client.aclose()
    await harness.state.db.dispose()


async def run(h: Harness, model: str, prompt: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "size": "1024*1024"}
    body.setdefault("images", [data_url()])
    body.update(fields)
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    assert await h.run_all() == 1
    return await h.result(task_id)


async def test_openai_edit_maps_request_and_outputs(h: Harness, upstream: UpstreamServer) -> None:
    result = await run(h, "up/edit", "make it blue", images=[data_url(), data_url((1, 2, 3))])
    assert result["status"] == "completed", result
    assert result["has_nsfw_contents"] == [False]
    assert result["info"] == {"revised_prompt": "make it blue"}
    path, fields = upstream.requests[-1]
    assert path == "/v1/images/edits"
    assert fields == {
        "prompt": "make it blue",
        "size": "1024x1024",
        "response_format": "b64_json",
        "n": "1",
        "model": "gpt-image-1",
        "images": 2,
    }
    (url,) = result["outputs"]
    download = await h.client.get(url.removeprefix("http://testserver"))
    assert download.headers["content-type"] == "image/png"
    assert download.content[:4] == b"\x89PNG"


async def test_generation_without_images_fetches_url_output(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/generate", "a lighthouse", images=[])
    assert result["status"] == "completed", result
    assert upstream.requests[-1] == (
        "/v1/images/generations",
        {"prompt": "a lighthouse", "size": "1024x1024", "response_format": "url", "n": 1},
    )
    # An image model that requires images still refuses an empty list at submit.
    response = await h.submit({"model": "up/edit", "prompt": "x", "images": []})
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "images"


async def test_upstream_flags_and_cost_reach_result_and_usage(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/edit", "cost nsfw")
    assert result["status"] == "completed", result
    assert result["has_nsfw_contents"] == [True]
    async with h.state.db.read() as session:
        line = (await session.scalars(select(UsageLine))).one()
    assert line.model == "up/edit"
    assert line.amount_micros == 40_000
    assert line.upstream_cost_micros == 12_300


async def test_429_with_retry_after_and_500_are_retried(
    h: Harness, upstream: UpstreamServer
) -> None:
    assert (await run(h, "up/edit", "busy"))["status"] == "completed"
    assert upstream.attempts["busy"] == 3
    assert (await run(h, "up/edit", "flaky"))["status"] == "completed"
    assert upstream.attempts["flaky"] == 2


async def test_persistent_5xx_fails_after_the_attempts(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/edit", "down")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_UNAVAILABLE
    assert "HTTP 503: overloaded" in result["error"]
    assert upstream.attempts["down"] == 3


async def test_4xx_maps_to_rejected_with_trimmed_message(h: Harness) -> None:
    result = await run(h, "up/edit", "reject")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_REJECTED
    assert "prompt rejected by the safety system (key [redacted])" in result["error"]
    assert len(result["error"]) < 400


async def test_malformed_json_is_a_bad_response(h: Harness) -> None:
    result = await run(h, "up/edit", "garbled")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_BAD_RESPONSE


async def test_slow_upstream_past_the_deadline_times_out(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/slow", "slow")
    assert result["error_code"] == ErrorCode.TIMEOUT
    async with h.state.db.read() as session:
        assert (await session.get(Task, result["id"])).status == "timeout"  # type: ignore[union-attr]
    assert upstream.attempts["slow"] == 1


async def test_output_url_at_a_blocked_address_is_refused(h: Harness) -> None:
    result = await run(h, "up/edit", "private-url")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_OUTPUT_REFUSED


async def test_output_url_on_loopback_is_refused_without_private_targets(
    tmp_path: Path, database_url: str, upstream: UpstreamServer
) -> None:
    harness = await open_harness(
        tmp_path, database_url, upstream, webhook_allow_private_targets=False
    )
    try:
        result = await run(harness, "up/edit", "loopback-url")
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_OUTPUT_REFUSED


async def test_outputs_over_the_byte_cap_fail(h: Harness) -> None:
    for prompt in ("inline", "loopback-url"):
        result = await run(h, "up/tiny", prompt)
        assert result["status"] == "failed"
        assert result["error_code"] == ErrorCode.UPSTREAM_OUTPUT_FETCH_FAILED
        assert "larger than the 100-byte limit" in result["error"]


async def test_queue_adapter_submits_polls_and_records_cost(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/queue", "paint it")
    assert result["status"] == "completed", result
    assert result["info"] == {"upstream_id": "job-0"}
    submitted = upstream.jobs["job-0"]
    assert submitted["polls"] == 2
    assert submitted["body"]["input"]["prompt"] == "paint it"
    assert submitted["body"]["input"]["image"].startswith("data:image/png;base64,")
    assert submitted["body"]["input"]["w"] == 1024
    async with h.state.db.read() as session:
        line = (await session.scalars(select(UsageLine))).one()
    assert line.upstream_cost_micros == 4200
    assert line.amount_micros == 0


async def test_audio_model_stores_the_upstream_bytes(h: Harness) -> None:
    response = await h.submit({"model": "up/audio", "prompt": "say hello"}, path="generateAudio")
    assert response.status_code == 200, response.text
    assert await h.run_all() == 1
    result = await h.result(response.json()["id"])
    assert result["status"] == "completed", result
    assert result["has_nsfw_contents"] == [False]
    download = await h.client.get(result["outputs"][0].removeprefix("http://testserver"))
    assert download.headers["content-type"] == "audio/mpeg"
    assert download.content == MP3


async def test_queue_failure_carries_the_reason(h: Harness) -> None:
    result = await run(h, "up/queue", "fail please")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.UPSTREAM_TASK_FAILED
    assert "CUDA out of memory" in result["error"]


async def test_credential_never_appears_in_logs_results_or_webhooks(
    h: Harness, upstream: UpstreamServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    results = [
        await run(h, "up/edit", prompt, webhook_url="http://127.0.0.1:9/hook")
        for prompt in ("reject", "down", "fine", "garbled")
    ]
    assert all(auth == f"Bearer {CREDENTIAL}" for auth in upstream.authorizations)
    async with h.state.db.read() as session:
        bodies = [row.body for row in (await session.scalars(select(WebhookDelivery))).all()]
        tasks = (await session.scalars(select(Task))).all()
    assert len(bodies) == 4
    stored = repr([(t.error_message, t.info, t.params) for t in tasks])
    for text in (caplog.text, repr(results), stored, repr(bodies)):
        assert CREDENTIAL not in text
    assert "[redacted]" in repr(results)


async def test_missing_credential_fails_the_task_without_naming_a_value(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    result = await run(h, "up/edit", "anything")
    assert result["status"] == "failed"
    assert result["error_code"] == ErrorCode.ENGINE_ERROR


async def test_one_worker_runs_many_upstream_calls_at_once(
    h: Harness, upstream: UpstreamServer
) -> None:
    upstream.delay = 0.3
    ids = []
    for index in range(20):
        response = await h.submit(
            {"model": "up/edit", "prompt": f"task {index}", "images": [data_url()]}
        )
        ids.append(response.json()["id"])
    stop = asyncio.Event()
    runner = asyncio.create_task(h.worker.run(stop))
    try:
        for task_id in ids:
            while (await h.result(task_id))["status"] in ("created", "processing"):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await runner
    statuses = [(await h.result(task_id))["status"] for task_id in ids]
    assert statuses == ["completed"] * len(ids)
    # The model's limit is 8: more than one call in flight, never more than the limit.
    assert 1 < upstream.max_in_flight <= 8


def test_a_bad_entry_names_the_field(tmp_path: Path) -> None:
    from genhook.engines.registry import build_registry

    settings = make_settings(
        tmp_path,
        "sqlite+aiosqlite:///x.db",
        upstream_models=[{"id": "up/q", "adapter": "queue", "base_url": "http://127.0.0.1:1"}],
    )
    named = r"^upstream model entry 1 \(up/q\) is invalid: the queue adapter needs .queue.$"
    with pytest.raises(ValueError, match=named):
        build_registry(settings)
    file = tmp_path / "models.json"
    file.write_text('[{"id": "up/f", "adapter": "openai-images", "base_url": "ftp://x"}]')
    settings = make_settings(tmp_path, "sqlite+aiosqlite:///x.db", upstream_models_file=file)
    with pytest.raises(ValueError, match="base_url"):
        build_registry(settings)


async def test_cpu_engines_keep_one_task_at_a_time_beside_upstream_tasks(
    h: Harness, upstream: UpstreamServer
) -> None:
    upstream.delay = 0.2
    ids = []
    for index in range(6):
        body: dict[str, Any] = {"model": "up/edit", "prompt": f"u{index}", "images": [data_url()]}
        if index % 2:
            body.update(model="test/fake-edit", prompt="sleep=0.1 edit", size="1024*1024")
        ids.append((await h.submit(body)).json()["id"])
    stop = asyncio.Event()
    runner = asyncio.create_task(h.worker.run(stop))
    try:
        for task_id in ids:
            while (await h.result(task_id))["status"] in ("created", "processing"):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await runner
    async with h.state.db.read() as session:
        rows = (await session.scalars(select(Task).where(Task.model == "test/fake-edit"))).all()
    spans = sorted((row.started_at or 0, row.finished_at or 0) for row in rows)
    assert [row.status for row in rows] == ["completed"] * 3
    # Each CPU task started only after the previous one had finished.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


async def test_upstream_tasks_ending_beside_a_running_cpu_engine_leave_the_worker_sound(
    h: Harness, upstream: UpstreamServer
) -> None:
    """Upstream tasks end while a CPU model's engine runs in the engine thread: that engine
    is not theirs, so the worker is not taken for one with an abandoned engine (it would
    stop claiming) and the tasks after them run."""
    upstream.delay = 0.2
    cpu = {"model": "test/fake-edit", "prompt": "sleep=1.0 edit", "size": "1024*1024"}
    ids = [(await h.submit({**cpu, "images": [data_url()]})).json()["id"]]
    for index in range(3):
        body = {"model": "up/edit", "prompt": f"u{index}", "images": [data_url()]}
        ids.append((await h.submit(body)).json()["id"])
    stop = asyncio.Event()
    runner = asyncio.create_task(h.worker.run(stop))
    try:
        while (await h.result(ids[1]))["status"] in ("created", "processing"):
            await asyncio.sleep(0.05)
        # Submitted once the upstream tasks have ended beside the running CPU engine.
        ids.append(
            (await h.submit({**cpu, "prompt": "sleep=0.01 edit", "images": [data_url()]})).json()[
                "id"
            ]
        )
        async with asyncio.timeout(30):
            for task_id in ids:
                while (await h.result(task_id))["status"] in ("created", "processing"):
                    await asyncio.sleep(0.05)
    finally:
        stop.set()
        await runner
    assert not h.worker.tainted
    assert [(await h.result(task_id))["status"] for task_id in ids] == ["completed"] * 5


async def test_queue_callback_is_received_once_and_ends_the_task(
    h: Harness, upstream: UpstreamServer
) -> None:
    response = await h.submit({"model": "up/callback", "prompt": "wait", "images": [data_url()]})
    task_id = response.json()["id"]
    stop = asyncio.Event()
    runner = asyncio.create_task(h.worker.run(stop))
    try:
        while "job-0" not in upstream.jobs:
            await asyncio.sleep(0.02)
        url = upstream.jobs["job-0"]["body"]["webhook"]
        assert url.startswith(f"http://testserver/api/v1/upstream/callback/{task_id}/")
        path = url.removeprefix("http://testserver")
        output = [f"{upstream.base_url}/files/x.png"]
        final = {"id": "job-0", "status": "succeeded", "output": output}
        wrong = await h.client.post(path[:-4] + "AAAA", json=final)
        assert wrong.status_code == 404
        assert wrong.json()["code"] == 404
        garbled = await h.client.post(
            path, content=b"{", headers={"Content-Type": "application/json"}
        )
        assert garbled.status_code == 400
        assert garbled.json()["errors"][0]["field"] == "body"
        not_json = await h.client.post(
            path, content=b'{"status": NaN}', headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code == 400
        assert not_json.json()["errors"][0]["field"] == "body"
        # A guessed URL is refused on the token alone, whatever its body.
        json_type = {"Content-Type": "application/json"}
        big = b"[" * (9 * 1024 * 1024)
        wrong = await h.client.post(path[:-4] + "AAAA", content=big, headers=json_type)
        assert wrong.status_code == 404, wrong.text
        unknown = await h.client.post(
            "/api/v1/upstream/callback/task_nope/" + "A" * 43, content=big, headers=json_type
        )
        assert unknown.status_code == 404
        # The right URL takes no more than a submit's JSON without image data ...
        padded = {"id": "job-0", "status": "running", "pad": "x" * (300 * 1024)}
        too_large = await h.client.post(path, json=padded)
        assert too_large.status_code == 413, too_large.text
        # ... nor more arrays and objects than a submit may hold.
        many = {"id": "job-0", "status": "running", "items": [[] for _ in range(2000)]}
        crowded = await h.client.post(path, json=many)
        assert crowded.status_code == 400, crowded.text
        assert crowded.json()["errors"][0]["field"] == "body"
        assert (await h.client.post(path, json=final)).status_code == 200
        assert (await h.client.post(path, json=final)).status_code == 404
        while (await h.result(task_id))["status"] in ("created", "processing"):
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await runner
    result = await h.result(task_id)
    assert result["status"] == "completed", result
    assert result["info"] == {"upstream_id": "job-0"}
    assert upstream.jobs["job-0"]["polls"] == 0
    async with h.state.db.read() as session:
        assert (await session.scalars(select(UpstreamCallback))).all() == []


async def test_redirects_are_refused_unless_allowed_and_never_leave_the_origin(
    h: Harness, upstream: UpstreamServer
) -> None:
    refused = await run(h, "up/edit", "redirect")
    assert refused["status"] == "failed"
    assert refused["error_code"] == ErrorCode.UPSTREAM_BAD_RESPONSE
    assert "redirect" in refused["error"]
    assert upstream.redirected == []
    followed = await run(h, "up/follow", "redirect")
    assert followed["status"] == "completed", followed
    assert upstream.redirected == [(f"127.0.0.1:{upstream.port}", f"Bearer {CREDENTIAL}")]
    away = await run(h, "up/follow", "redirect away")
    assert away["status"] == "failed"
    assert away["error_code"] == ErrorCode.UPSTREAM_BAD_RESPONSE
    assert "origin" in away["error"]
    assert all(host.startswith("127.0.0.1:") for host, _ in upstream.redirected)


async def test_an_upstream_job_id_stays_one_path_segment(
    h: Harness, upstream: UpstreamServer
) -> None:
    result = await run(h, "up/queue", "sneaky-id")
    assert result["status"] == "completed", result
    assert result["info"]["upstream_id"] == "../../../steal?x="
    assert "/steal" not in upstream.raw_paths
    assert "/queue/jobs/..%2F..%2F..%2Fsteal%3Fx=" in upstream.raw_paths
