"""Cancel, idempotent submit, limits and retention against ``genhook serve`` as a subprocess,
through the SDK and the CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from genhook.client import Client, Conflict, Prediction, TooManyRequests
from genhook.receiver import WebhookVerifier
from tests.acceptance.test_client_live import Inbox
from tests.conftest import LiveService, live_database, start_service, stop_service
from tests.support.http import HTTP

MODEL = "test/fake-edit"


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 10)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveService]:
    """One ``serve`` per database for this module; every test ends with its worker idle."""
    svc = start_service(
        tmp_path_factory.mktemp("task-api"),
        live_database(request),
        GENHOOK_OUTPUT_RETENTION="8",
        GENHOOK_RETENTION_INTERVAL_SECONDS="0.2",
        GENHOOK_AUTH_CACHE_SECONDS="0.2",
    )
    yield svc
    stop_service(svc)


@pytest.fixture
def service(shared: LiveService) -> LiveService:
    """The shared service under an account of this test's own: usage and limits are per
    account."""
    return shared.as_new_account()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


def wait_until(client: Client, task_id: str, statuses: tuple[str, ...]) -> Prediction:
    for _ in range(600):
        prediction = client.result(task_id)
        if prediction.status in statuses:
            return prediction
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {statuses}")


def test_cancel_from_the_sdk_and_the_cli(service: LiveService, inbox: Inbox) -> None:
    with Client(service.api_key, base_url=service.base_url) as client:
        # One worker: the first task holds it, so the second waits in the queue.
        running = client.edit("wait=60", png(), model=MODEL, size="1024*1024")
        waiting = client.edit("edit", png(), model=MODEL, size="1024*1024", webhook_url=inbox.url)
        assert waiting.urls["cancel"].endswith(f"/{waiting.id}/cancel")
        wait_until(client, running.id, ("processing",))

        target = ("--base-url", service.base_url, "--api-key", service.api_key)
        cli = service.cli("cancel", waiting.id, *target, "--json")
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert json.loads(cli.stdout)["status"] == "canceled"
        delivery = inbox.wait_for(waiting.id)
        verifier = WebhookVerifier(hmac_secret=service.signing_secret)
        event = verifier.verify(dict(delivery.headers), delivery.body)
        assert event.status == "ERROR" and event.payload.status == "canceled"

        stopped = client.cancel(running.id)
        assert stopped.canceled and stopped.error_code == 4004
        with pytest.raises(Conflict):
            client.cancel(running.id)
        again = service.cli("cancel", running.id, *target)
        assert again.returncode == 3 and "409" in again.stderr

        # The engine stopped early, so the same worker runs the next task.
        after = client.edit("edit", png(), model=MODEL, size="1024*1024")
        done = client.wait(after.id, timeout=60, poll_interval=0.05)
        assert done.succeeded
        assert client.usage().task_count == 1
    assert "restarting" not in service.log()


def test_parallel_idempotent_retries_and_limits(service: LiveService) -> None:
    created: list[str] = []
    errors: list[BaseException] = []

    def retry() -> None:
        try:
            with Client(service.api_key, base_url=service.base_url) as client:
                prediction = client.edit(
                    "edit", png(), model=MODEL, size="1024*1024", idempotency_key="checkout-7"
                )
            created.append(prediction.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=retry) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(created) == 20 and len(set(created)) == 1

    limited = service.cli("accounts", "limits", service.account_id, "--in-flight", "1", "--json")
    assert limited.returncode == 0, limited.stdout + limited.stderr
    assert json.loads(limited.stdout)["effective"]["in_flight"] == 1
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": "wait=60",
        "images": ["data:image/png;base64," + base64.b64encode(png()).decode()],
        "size": "1024*1024",
    }
    headers = {"Authorization": f"Bearer {service.api_key}"}
    url = service.base_url + "/api/v1/model/generateImage"
    # The override reaches the api process within its cache time; the first task of
    # the retries may still be in flight, so at most one more is let in.
    accepted: list[str] = []
    for _ in range(100):
        answer = HTTP.post(url, json=body, headers=headers, timeout=30)
        if answer.status_code != 200:
            break
        accepted.append(answer.json()["id"])
        time.sleep(0.05)
    assert answer.status_code == 429
    assert int(answer.headers["Retry-After"]) >= 1
    assert answer.json()["errors"][0]["field"] == "tasks_in_flight"
    fields = {k: v for k, v in body.items() if k != "model"}
    with Client(service.api_key, base_url=service.base_url, max_retries=0) as client:
        with pytest.raises(TooManyRequests):
            client.submit(MODEL, **fields)
        for task_id in accepted:
            client.cancel(task_id)
    cleared = service.cli("accounts", "limits", service.account_id, "--clear")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr


def test_outputs_expire_and_answer_410(service: LiveService) -> None:
    with Client(service.api_key, base_url=service.base_url) as client:
        created = client.edit("edit", png(), model=MODEL, size="1024*1024")
        done = client.wait(created.id, timeout=60, poll_interval=0.05, max_poll_interval=0.1)
        assert done.succeeded and done.outputs_expire_at is not None
        assert HTTP.get(done.outputs[0]).status_code == 200
        for _ in range(600):
            gone = HTTP.get(done.outputs[0])
            if gone.status_code != 200:
                break
            time.sleep(0.05)
        assert gone.status_code == 410
        assert gone.json()["code"] == 410
        kept = client.result(created.id)
        assert kept.succeeded and kept.outputs == done.outputs
