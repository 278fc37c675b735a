"""``genhook serve`` with two workers: ``/metrics`` adds up every process of the machine,
deliveries are counted by outcome and attempt, and JSON log lines carry the task id.

On SQLite only: adding up the processes' files and the JSON logs do not depend on the
database, and the figures read from the database (queue depth, outbox, database up) are
checked on both in tests/integration/test_metrics.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from genhook.files import shared_memory_dir
from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url

MODEL = "test/fake-edit"


class Receiver:
    """Answers 200, except the first request to ``/flaky``, which gets a 500."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                first_flaky = self.path == "/flaky" and "/flaky" not in receiver.paths
                receiver.paths.append(self.path)
                self.send_response(500 if first_flaky else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box = Receiver()
    yield box
    box.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LiveService]:
    live = start_service(
        tmp_path,
        None,
        GENHOOK_WORKERS="2",
        GENHOOK_LOG_FORMAT="json",
        GENHOOK_WEBHOOK_RETRY_BASE_SECONDS="0.05",
        GENHOOK_WEBHOOK_RETRY_CAP_SECONDS="0.2",
    )
    yield live
    stop_service(live)


def submit(service: LiveService, prompt: str, webhook_url: str | None) -> str:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "images": [data_url()],
        "size": "1024*1024",
    }
    if webhook_url:
        body["webhook_url"] = webhook_url
    response = HTTP.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json=body,
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


def result(service: LiveService, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        data: dict[str, Any] = HTTP.get(
            f"{service.base_url}/api/v1/model/result/{task_id}",
            headers={"Authorization": f"Bearer {service.api_key}"},
            timeout=10,
        ).json()
        if data["status"] in ("completed", "failed"):
            return data
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} did not end:\n{service.log()[-3000:]}")


def scrape(service: LiveService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = HTTP.get(f"{service.base_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_add_up_every_process_and_logs_are_json(
    service: LiveService, receiver: Receiver
) -> None:
    ok = [submit(service, "edit sleep=0.4", receiver.url + "/ok") for _ in range(4)]
    flaky = submit(service, "fail", receiver.url + "/flaky")
    crash = submit(service, "crash", None)
    done = {task_id: result(service, task_id) for task_id in [*ok, flaky, crash]}
    # Both workers ran tasks: only the files of every process add up to these counts.
    assert len({done[task_id]["info"]["pid"] for task_id in ok}) == 2

    expected = {
        ("genhook_tasks_submitted_total", (("model", MODEL),)): 6,
        ("genhook_tasks_started_total", (("model", MODEL),)): 6,
        ("genhook_tasks_finished_total", (("model", MODEL), ("outcome", "completed"))): 4,
        ("genhook_tasks_finished_total", (("model", MODEL), ("outcome", "failed"))): 2,
        ("genhook_task_run_seconds_count", (("model", MODEL), ("outcome", "completed"))): 4,
        ("genhook_webhook_attempts_total", (("attempt", "1"), ("outcome", "delivered"))): 4,
        ("genhook_webhook_attempts_total", (("attempt", "1"), ("outcome", "retry"))): 1,
        ("genhook_webhook_attempts_total", (("attempt", "2"), ("outcome", "delivered"))): 1,
        ("genhook_webhook_terminal_to_receipt_seconds_count", ()): 5,
        ("genhook_webhook_outbox_pending", ()): 0,
        ("genhook_metrics_database_up", ()): 1,
    }
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(service)
        seen = {key: samples.get(key) for key in expected}
        if seen == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == expected, service.log()[-3000:]
    assert value(samples, "genhook_task_run_seconds_sum", model=MODEL, outcome="completed") >= 1.6
    assert value(samples, "genhook_tasks_waiting", model=MODEL) == 0
    assert sorted(receiver.paths) == ["/flaky", "/flaky", "/ok", "/ok", "/ok", "/ok"]
    # Each worker and the api count into their own files of this supervisor's directory, in
    # shared memory by default (metrics.serve_directory), never on the data disk.
    shared = shared_memory_dir()
    assert shared is not None
    directory = shared / "metrics" / f"{socket.gethostname()}-{service.process.pid}"
    assert not (service.data_dir / "metrics").exists()
    assert len(list(directory.glob("*.db"))) >= 3

    stop_service(service)
    lines = [json.loads(line) for line in service.log().splitlines() if line.startswith("{")]
    assert {line["role"] for line in lines} >= {"serve", "worker"}
    assert all({"time", "level", "logger", "message", "pid"} <= line.keys() for line in lines)
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    failed = [line for line in lines if line.get("task_id") == flaky]
    assert any("failed" in line["message"] and line["role"] == "worker" for line in failed)
    (crashed,) = [line for line in lines if line.get("task_id") == crash and "exc" in line]
    assert "unexpected engine bug" in crashed["exc"]
    assert crashed["account_id"] == service.account_id
    # Nothing but the first start's credentials block is outside JSON.
    others = [line for line in service.log().splitlines() if not line.startswith("{")]
    assert all(line.startswith(("Created the default", "  ")) for line in others), others
