"""Waiting and watching against ``genhook serve`` over real HTTP, through the SDK and the
CLI, on SQLite and PostgreSQL: a stream broken mid-task resumes where it stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from genhook.client import Client, SSEDecoder, TaskEvent
from tests.conftest import LiveService, live_database, start_service, stop_service
from tests.support.images import data_url

MODEL = "test/fake-edit"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveService]:
    """One ``serve`` per database for the tests that leave it running."""
    live = start_service(tmp_path_factory.mktemp("watch"), live_database(request))
    yield live
    stop_service(live)


@pytest.fixture
def service(shared: LiveService) -> LiveService:
    """The shared service under an account of this test's own (task listings are per account)."""
    return shared.as_new_account()


@pytest.fixture
def own_service(tmp_path: Path, database_url: str) -> Iterator[LiveService]:
    """A service of this test's own, for a test that stops it."""
    live = start_service(tmp_path, database_url)
    yield live
    stop_service(live)


def client(service: LiveService) -> Client:
    return Client(service.api_key, base_url=service.base_url, timeout=30)


def edit(c: Client, prompt: str, wait: float | None = None) -> str:
    created = c.submit(MODEL, prompt=prompt, images=[data_url()], size="1024*1024", wait=wait)
    return created.id


def test_submit_with_wait_returns_outputs(service: LiveService) -> None:
    with client(service) as c:
        done = c.submit(MODEL, prompt="edit", images=[data_url()], size="1024*1024", wait=30)
        assert done.status == "completed" and len(done.outputs) == 1
        again = c.result(done.id, wait=5, logs=True)
        assert again.status == "completed" and again.logs == []


def test_stream_broken_mid_task_resumes_without_loss(service: LiveService) -> None:
    with client(service) as c:
        task_id = edit(c, "sleep=2 steps=4")
        # Read the stream by hand until the first log line arrives, then drop the connection.
        first: list[TaskEvent] = []
        request = c._events_request(task_id, None)
        with httpx.stream(**request) as response:
            decoder = SSEDecoder()
            for line in response.iter_lines():
                event = decoder.feed(line)
                if event is not None:
                    first.append(event)
                    if event.prediction.logs:
                        break
        assert first and first[-1].event == "processing"
        rest = list(c.events(task_id, last_event_id=first[-1].id))
    assert rest[-1].event == "completed" and rest[-1].prediction.outputs
    assert all(not event.done for event in rest[:-1])
    lines = [line.message for event in first + rest for line in event.prediction.logs]
    assert lines == [f"step {n} of 4" for n in range(1, 5)]
    progress = [e.prediction.progress for e in first + rest if e.prediction.progress is not None]
    # Progress shows while the task runs; the terminal event is the plain final result.
    assert progress and progress == sorted(progress) and 0 < progress[0] <= progress[-1] <= 1
    assert rest[-1].prediction.progress is None


def test_cli_tasks_and_watch(service: LiveService) -> None:
    with client(service) as c:
        ids = [edit(c, "edit") for _ in range(3)]
        failing = edit(c, "fail")
        page = c.tasks(limit=2)
        assert [item.id for item in page.items] == [failing, ids[2]]
        assert page.next_cursor is not None
        rest = c.tasks(limit=10, cursor=page.next_cursor)
        assert [item.id for item in rest.items] == [ids[1], ids[0]] and rest.next_cursor is None
    auth = ["--base-url", service.base_url, "--api-key", service.api_key]
    watched = service.cli("watch", failing, "--json", *auth)
    assert watched.returncode == 1, watched.stderr
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert events[-1]["event"] == "failed" and events[-1]["error_code"]
    shown = service.cli("watch", ids[0], *auth)
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout
    listed = service.cli("tasks", "--status", "failed", "--json", *auth)
    assert listed.returncode == 0, listed.stderr
    assert [item["id"] for item in json.loads(listed.stdout)["items"]] == [failing]
    table = service.cli("tasks", "--limit", "2", *auth)
    assert failing in table.stdout and "--cursor" in table.stdout
    bad = service.cli("tasks", "--limit", "500", *auth)
    assert bad.returncode == 3 and "limit" in bad.stderr


def test_shutdown_ends_open_streams_at_once(own_service: LiveService) -> None:
    service = own_service
    with client(service) as c:
        task_id = edit(c, "sleep=8 steps=8")
        request = c._events_request(task_id, None)
        received: list[TaskEvent] = []
        with httpx.stream(**request) as response:
            decoder = SSEDecoder()
            for line in response.iter_lines():
                event = decoder.feed(line)
                if event is None:
                    continue
                received.append(event)
                if event.event == "processing" and service.process.poll() is None:
                    service.process.terminate()
            # The server closed the stream cleanly, before the task ended.
    assert received and not received[-1].done
    assert service.process.wait(30) == 0
    # uvicorn did not have to cut the stream off at the end of its grace period.
    assert "graceful shutdown exceeded" not in service.log()
