"""The bucket blob store (``GENHOOK_BLOB_STORE=s3://...``) against moto's S3 server on
loopback: the store itself, tasks with input images end to end on SQLite and PostgreSQL in
both output delivery modes, retention, and the bucket going away mid-test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from sqlalchemy import func, select, update

from genhook.db import Blob, Task, now_ms
from genhook.faults import StorageUnavailable, is_infrastructure_error
from genhook.storage import FileBlobStore, open_blob_store
from genhook.storage.blobs import close_blob_store
from genhook.storage.s3 import S3BlobStore
from genhook.tasks.retention import Retention
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url
from tests.support.s3 import S3_ENV, Partition, S3Server, s3_client

MODEL = "test/fake-edit"


def bucket_settings(
    tmp_path: Path, database_url: str, server: S3Server | Partition, **extra: Any
) -> Any:
    bucket = server.new_bucket()
    return make_settings(
        tmp_path,
        database_url,
        blob_store=f"s3://{bucket}/genhook",
        s3_endpoint_url=server.endpoint_url,
        s3_region="us-east-1",
        **extra,
    )


@pytest.fixture
async def store(tmp_path: Path, s3_server: S3Server) -> AsyncIterator[S3BlobStore]:
    settings = bucket_settings(tmp_path, "sqlite+aiosqlite:///unused.db", s3_server)
    blobs = open_blob_store(settings, db=None)  # type: ignore[arg-type]
    assert isinstance(blobs, S3BlobStore)
    yield blobs
    await blobs.aclose()


async def test_put_get_range_presign_delete(store: S3BlobStore, s3_server: S3Server) -> None:
    data = os.urandom(700 * 1024)  # several streamed chunks
    await store.put("outputs/abc.mp4", data, "video/mp4")
    assert s3_server.keys(store.location.bucket) == ["genhook/outputs/abc.mp4"]
    assert await store.get("outputs/abc.mp4") == (data, "video/mp4")
    info = await store.info("outputs/abc.mp4")
    assert info is not None and (info.size, info.content_type) == (len(data), "video/mp4")
    chunks = [chunk async for chunk in await store.open_range("outputs/abc.mp4", 10, 600_009)]
    assert len(chunks) > 1
    assert b"".join(chunks) == data[10:600_010]
    url = await store.presigned_url("outputs/abc.mp4")
    assert "X-Amz-Expires=300" in url and url.startswith(s3_server.endpoint_url)
    async with httpx.AsyncClient() as client:
        fetched = await client.get(url)
    assert fetched.status_code == 200 and fetched.content == data
    await store.delete("outputs/abc.mp4")
    assert await store.get("outputs/abc.mp4") is None
    assert await store.info("outputs/abc.mp4") is None
    assert s3_server.keys(store.location.bucket) == []
    await store.delete("outputs/abc.mp4")  # deleting twice is not an error


async def test_bad_keys_and_types_are_refused(store: S3BlobStore) -> None:
    assert await store.get("../etc/passwd") is None
    with pytest.raises(ValueError, match="extension"):
        await store.put("outputs/x.png", b"x", "image/jpeg")
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.put("outputs/../x.png", b"x", "image/png")


async def test_an_unreachable_bucket_is_an_infrastructure_fault(
    tmp_path: Path, partition: Partition
) -> None:
    settings = bucket_settings(tmp_path, "sqlite+aiosqlite:///unused.db", partition)
    partition.cut()
    blobs = open_blob_store(settings, db=None)  # type: ignore[arg-type]
    with pytest.raises(StorageUnavailable) as caught:
        await blobs.put("outputs/a.png", b"png", "image/png")
    assert is_infrastructure_error(caught.value)
    assert "Could not connect" in str(caught.value)
    with pytest.raises(StorageUnavailable):
        await blobs.get("outputs/a.png")
    await close_blob_store(blobs)


async def test_a_missing_bucket_is_named(tmp_path: Path, s3_server: S3Server) -> None:
    settings = make_settings(
        tmp_path,
        "sqlite+aiosqlite:///unused.db",
        blob_store="s3://no-such-bucket-here/p",
        s3_endpoint_url=s3_server.endpoint_url,
    )
    blobs = open_blob_store(settings, db=None)  # type: ignore[arg-type]
    with pytest.raises(StorageUnavailable, match="NoSuchBucket"):
        await blobs.put("outputs/a.png", b"png", "image/png")
    await close_blob_store(blobs)


def test_a_malformed_or_conflicting_blob_store_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"s3://bucket/prefix"):
        make_settings(tmp_path, "sqlite+aiosqlite:///x.db", blob_store="s3:///prefix-only")
    with pytest.raises(ValueError, match=r"GENHOOK_STORAGE=database"):
        make_settings(
            tmp_path, "sqlite+aiosqlite:///x.db", storage="database", blob_store="s3://b/p"
        )
    directory = make_settings(tmp_path, "sqlite+aiosqlite:///x.db", blob_store=str(tmp_path / "b"))
    store = open_blob_store(directory, db=None)  # type: ignore[arg-type]
    assert isinstance(store, FileBlobStore) and store.root == (tmp_path / "b").resolve()


@pytest.fixture(params=["stream", "redirect"])
async def bucket_harness(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, s3_server: S3Server
) -> AsyncIterator[Harness]:
    settings = bucket_settings(tmp_path, database_url, s3_server, output_delivery=request.param)
    h = await make_harness(settings)
    yield h
    await h.client.aclose()
    await close_blob_store(h.state.storage)
    await h.state.db.dispose()


async def row(h: Harness, task_id: str) -> Task:
    async with h.state.db.read() as session:
        task = await session.get(Task, task_id)
    assert task is not None
    return task


async def submit(h: Harness) -> str:
    body = {"model": MODEL, "prompt": "edit", "size": "1024*1024", "images": [data_url()]}
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def test_a_task_with_an_input_runs_on_the_bucket(
    bucket_harness: Harness, s3_server: S3Server
) -> None:
    h = bucket_harness
    settings = h.state.settings
    assert isinstance(h.state.storage, S3BlobStore)
    bucket = h.state.storage.location.bucket
    task_id = await submit(h)
    # The input went to the bucket, not to the database.
    assert s3_server.keys(bucket) == [f"genhook/inputs/{task_id}_0.png"]
    async with h.state.db.read() as session:
        assert await session.scalar(select(func.count()).select_from(Blob)) == 0
    assert await h.run_all() == 1
    result = await h.result(task_id)
    assert result["status"] == "completed", result
    assert result["info"]["inputs"] == 1
    (url,) = result["outputs"]
    path = url.removeprefix("http://testserver")
    key = path.removeprefix("/api/v1/outputs/")
    # The worker deleted the input once the task ended; the output stays for retention.
    assert s3_server.keys(bucket) == [f"genhook/{key}"]
    stored = await h.state.storage.get(key)
    assert stored is not None and stored[1] == "image/jpeg"
    data = stored[0]

    response = await h.client.get(path)
    if settings.output_delivery == "redirect":
        assert response.status_code == 307
        assert response.headers["cache-control"] == "private, no-store"
        location = response.headers["location"]
        assert location.startswith(s3_server.endpoint_url) and "X-Amz-Signature" in location
        async with httpx.AsyncClient() as client:
            fetched = await client.get(location, headers={"Range": "bytes=0-9"})
        assert fetched.status_code == 206 and fetched.content == data[:10]
        # The console's players (same origin, under a CSP of 'self') are streamed to.
        console = await h.client.get(path, headers={"Sec-Fetch-Site": "same-origin"})
        assert console.status_code == 200 and console.content == data
    else:
        assert response.status_code == 200
        assert response.content == data
        assert response.headers["content-type"] == "image/jpeg"
        assert response.headers["accept-ranges"] == "bytes"
        ranged = await h.client.get(path, headers={"Range": "bytes=5-14"})
        assert ranged.status_code == 206 and ranged.content == data[5:15]
        assert ranged.headers["content-range"] == f"bytes 5-14/{len(data)}"
        tail = await h.client.get(path, headers={"Range": "bytes=-4"})
        assert tail.status_code == 206 and tail.content == data[-4:]
        past = await h.client.get(path, headers={"Range": f"bytes={len(data)}-"})
        assert past.status_code == 416
        assert past.headers["content-range"] == f"bytes */{len(data)}"
    missing = await h.client.get("/api/v1/outputs/outputs/NoSuchOutputAtAll.jpeg")
    assert missing.status_code == 404 and missing.json()["code"] == 404

    # Retention deletes the output and the input from the bucket; the URL then answers 410.
    report = await Retention(settings, h.state.db, h.state.storage).run_once(
        now=now_ms() + int(settings.output_retention.total_seconds() * 1000) + 1000
    )
    assert (report.tasks, report.outputs) == (1, 1)
    assert s3_server.keys(bucket) == []
    gone = await h.client.get(path)
    assert gone.status_code == 410, gone.text


async def test_cancel_deletes_the_input_from_the_bucket(
    bucket_harness: Harness, s3_server: S3Server
) -> None:
    h = bucket_harness
    assert isinstance(h.state.storage, S3BlobStore)
    task_id = await submit(h)
    assert s3_server.keys(h.state.storage.location.bucket) == [f"genhook/inputs/{task_id}_0.png"]
    canceled = await h.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=h.headers)
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    assert s3_server.keys(h.state.storage.location.bucket) == []
    assert await h.run_all() == 0


async def test_a_base64_result_reads_the_bucket(bucket_harness: Harness) -> None:
    h = bucket_harness
    body = {
        "model": MODEL,
        "prompt": "edit",
        "size": "1024*1024",
        "images": [data_url()],
        "enable_base64_output": True,
    }
    response = await h.submit(body)
    assert response.status_code == 200, response.text
    assert await h.run_all() == 1
    result = await h.result(response.json()["id"])
    assert result["status"] == "completed" and result["outputs"][0].startswith("/9j/")


async def test_the_bucket_going_away_answers_503_and_requeues(
    tmp_path: Path, database_url: str, partition: Partition
) -> None:
    settings = bucket_settings(tmp_path, database_url, partition, fault_retry_seconds=0.3)
    h = await make_harness(settings)
    try:
        done = await submit(h)
        assert await h.run_all() == 1
        path = (await h.result(done))["outputs"][0].removeprefix("http://testserver")
        waiting = await submit(h)
        partition.cut()

        # Requests that need the bucket: 503 with Retry-After, in the service's shape.
        for response in (
            await h.client.get(path),
            await h.submit({"model": MODEL, "prompt": "edit", "images": [data_url()]}),
        ):
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["code"] == 503
        async with h.state.db.read() as session:
            assert await session.scalar(select(func.count()).select_from(Task)) == 2

        # The worker cannot read the input: the task goes back to the queue, unharmed.
        assert await h.worker.run_turn()
        task = await row(h, waiting)
        assert (task.status, task.error_code, task.lease_losses) == ("created", None, 0)
        assert task.available_at > now_ms()

        # Back again, the requeued task runs, and the earlier output is served.
        partition.heal()
        async with h.state.db.write() as session:
            await session.execute(update(Task).where(Task.id == waiting).values(available_at=0))
        assert await h.worker.run_turn()
        assert (await h.result(waiting))["status"] == "completed"
        assert (await h.client.get(path)).status_code in (200, 307)
    finally:
        await h.client.aclose()
        await close_blob_store(h.state.storage)
        await h.state.db.dispose()


async def test_a_missing_input_object_fails_its_task_clearly(
    bucket_harness: Harness, s3_server: S3Server
) -> None:
    h = bucket_harness
    assert isinstance(h.state.storage, S3BlobStore)
    task_id = await submit(h)
    s3_client(s3_server.endpoint_url).delete_object(
        Bucket=h.state.storage.location.bucket, Key=f"genhook/inputs/{task_id}_0.png"
    )
    assert await h.run_all() == 1
    result = await h.result(task_id)
    assert (result["status"], result["error_code"]) == ("failed", 4003), result
    assert "input image 0 is missing" in result["error"]


async def test_a_failing_bucket_is_an_infrastructure_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 endpoint that answers 503 SlowDown (the outside world, faked on loopback)."""
    # This test starts no S3 server, whose fixture would set the SDK's environment: without
    # credentials the SDK would refuse before sending anything (and look for an instance role).
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    calls = 0

    async def slow_down(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        body = "<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
        return web.Response(status=503, text=body, content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", slow_down)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    settings = make_settings(
        tmp_path,
        "sqlite+aiosqlite:///unused.db",
        blob_store="s3://bucket/p",
        s3_endpoint_url=f"http://127.0.0.1:{port}",
        s3_region="us-east-1",
    )
    blobs = open_blob_store(settings, db=None)  # type: ignore[arg-type]
    try:
        with pytest.raises(StorageUnavailable, match=r"SlowDown \(HTTP 503\)") as caught:
            await blobs.put("outputs/a.png", b"png", "image/png")
        assert is_infrastructure_error(caught.value)
        assert calls >= 1
    finally:
        await close_blob_store(blobs)
        await runner.cleanup()
