"""Fault injection on the whole service, real processes on loopback, SQLite and PostgreSQL:
SIGKILL of every process kind (during start-up too), PostgreSQL restarts, a backlog several
times the deadline, and SIGTERM with tasks in flight. At the end the counts balance: every
accepted task terminal, every webhook acknowledged, usage equal to completed tasks, and no
process left behind.

Recovery times are printed (run with ``-s`` to see them), never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from genhook.db import Database, Task, UsageLine
from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.postgres import PostgresServer, _as_postgres, _find
from tests.support.processes import processes_with

MODEL = "test/fake-edit"
MARK = "GENHOOK_TEST_GENERATION"
TERMINAL = ("completed", "failed", "timeout")


def generation(mark: str) -> list[int]:
    """Live processes started under ``mark`` (children inherit the environment)."""
    return processes_with(MARK, mark)


def assert_generation_gone(mark: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while generation(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = {}
    for pid in generation(mark):  # never leave them behind, even when failing
        with contextlib.suppress(OSError):
            alive[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes of generation {mark} still alive {within} s later: {alive}"


class Hooks:
    """A webhook receiver on loopback that acknowledges everything and counts by task id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                task_id = json.loads(body)["session_id"]
                with lock:
                    hooks.ids[task_id] = hooks.ids.get(task_id, 0) + 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    receiver = Hooks()
    yield receiver
    receiver.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def submit(service: LiveService, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"}
    body.update(fields)
    return HTTP.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json=body,
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    )


def submit_ok(service: LiveService, **fields: Any) -> str:
    response = submit(service, **fields)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


def result(service: LiveService, task_id: str) -> dict[str, Any]:
    response = HTTP.get(
        f"{service.base_url}/api/v1/model/result/{task_id}",
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def wait_terminal(service: LiveService, ids: list[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    done: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for task_id in ids:
            if task_id not in done:
                data = result(service, task_id)
                if data["status"] in TERMINAL:
                    done[task_id] = data
        if len(done) == len(ids):
            return done
        time.sleep(0.1)
    raise AssertionError(f"{len(ids) - len(done)} task(s) never ended:\n{service.log()[-3000:]}")


def assert_balanced(service: LiveService, outcomes: dict[str, Any], hooks: Hooks | None) -> None:
    """Usage equals completed tasks; every webhook acknowledged at least once."""
    completed = {tid for tid, data in outcomes.items() if data["status"] == "completed"}
    usage = HTTP.get(
        f"{service.base_url}/api/v1/usage?limit=1000",
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    ).json()
    billed = [item["task_id"] for item in usage["items"]]
    assert sorted(billed) == sorted(completed)
    if hooks is not None:
        deadline = time.monotonic() + 30
        while set(outcomes) - set(hooks.ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(outcomes) - set(hooks.ids), "webhooks never acknowledged"


def task_rows(service: LiveService, url: str | None) -> dict[str, Task]:
    async def read() -> dict[str, Task]:
        db = Database(url or f"sqlite+aiosqlite:///{service.data_dir / 'genhook.db'}")
        try:
            async with db.read() as session:
                return {task.id: task for task in (await session.scalars(select(Task))).all()}
        finally:
            await db.dispose()

    return asyncio.run(read())


def worker_pid(service: LiveService, url: str | None, task_id: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        task = task_rows(service, url)[task_id]
        if task.status == "processing" and task.lease_owner:
            return int(task.lease_owner.split(":")[-1].split("/")[0])
        time.sleep(0.05)
    raise AssertionError("the task was never claimed")


def start(tmp_path: Path, url: str | None, mark: str, **env: str) -> LiveService:
    return start_service(tmp_path, url, **{MARK: mark, **env})


def test_no_process_outlives_a_killed_supervisor(tmp_path: Path, db_url: str | None) -> None:
    mark = uuid.uuid4().hex
    live = start(tmp_path, db_url, mark, GENHOOK_WORKERS="2")
    task_id = submit_ok(live, prompt="sleep=30")
    worker_pid(live, db_url, task_id)
    live.process.kill()
    live.process.wait()
    assert_generation_gone(mark)
    # Killed at random moments of start-up: workers spawning, migrating, importing.
    rng = random.Random()
    for delay in (0.05, rng.uniform(0.2, 1.5), rng.uniform(1.5, 3.5)):
        mark = uuid.uuid4().hex
        process = subprocess.Popen(
            [sys.executable, "-m", "genhook.cli", "serve"],
            env={**live.env, MARK: mark},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        time.sleep(delay)
        process.kill()
        process.wait()
        assert_generation_gone(mark)
    # The orphans gave back the task they held, uncharged (this generation has no workers,
    # so nothing claims it before we look).
    again = start(tmp_path, db_url, uuid.uuid4().hex, GENHOOK_WORKERS="0")
    try:
        rows = task_rows(again, db_url)
        assert (rows[task_id].status, rows[task_id].lease_losses) == ("created", 0)
    finally:
        stop_service(again)
        assert_generation_gone(again.env[MARK])


def test_killed_processes_lose_nothing(tmp_path: Path, db_url: str | None, hooks: Hooks) -> None:
    # A long lease: every quick re-run below is the supervisor's doing, not the lease's.
    env = {"GENHOOK_WORKERS": "2", "GENHOOK_LEASE_SECONDS": "30", "GENHOOK_MAX_LEASE_LOSSES": "5"}
    first = uuid.uuid4().hex
    live = start(tmp_path, db_url, first, **env)
    ids = [submit_ok(live, prompt="sleep=0.3", webhook_url=hooks.url) for _ in range(12)]
    try:
        # Kill to re-run: a worker killed mid-task; its task runs again elsewhere.
        probe = submit_ok(live, prompt="sleep=1", webhook_url=hooks.url)
        victim = worker_pid(live, db_url, probe)
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        # The re-run's claim time is on the row: no polling race with a quick re-run.
        wait_terminal(live, [probe])
        rerun = task_rows(live, db_url)[probe]
        assert rerun.attempts == 2 and rerun.lease_losses == 1
        assert rerun.started_at is not None
        print(f"\n[faults] killed worker to re-run: {rerun.started_at / 1000 - killed:.2f} s")
        # Given back by the running dispatcher, not by a release process started for it.
        assert f"dispatcher-0 genhook.tasks.lifecycle: task {probe} lost its lease" in live.log()
        ids.append(probe)
        # The dispatcher, then the supervisor itself.
        dispatchers = [
            pid
            for pid in generation(first)
            if b" dispatcher " in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        ]
        assert dispatchers
        for pid in dispatchers:
            os.kill(pid, signal.SIGKILL)
        ids += [submit_ok(live, prompt="sleep=0.2", webhook_url=hooks.url) for _ in range(4)]
        time.sleep(0.5)
        live.process.kill()
        live.process.wait()
        assert_generation_gone(first)
    finally:
        stop_service(live)
    second = uuid.uuid4().hex
    live = start(tmp_path, db_url, second, **env)
    try:
        outcomes = wait_terminal(live, ids)
        assert {data["status"] for data in outcomes.values()} == {"completed"}
        assert_balanced(live, outcomes, hooks)
    finally:
        stop_service(live)
    assert_generation_gone(second)


def _unhandled(log: str) -> str:
    """The first unhandled error's traceback, its last lines (where the error is named)."""
    start = log.find("unhandled")
    if start < 0:
        return "no unhandled error in the log"
    lines = log[start:].splitlines()
    # The next log record starts with its date.
    end = next((i for i, line in enumerate(lines[1:], 1) if line[:1].isdigit()), len(lines))
    return "\n".join(lines[:1] + lines[max(1, end - 40) : end])


@pytest.mark.postgres
def test_postgres_restarts(tmp_path: Path, pg_server: PostgresServer, pg_url: str) -> None:
    # The test server trades durability for speed (synchronous_commit=off), and an immediate
    # shutdown would then lose commits already acknowledged; production runs with it on.
    pg_server.psql(f"ALTER DATABASE {pg_url.rsplit('/', 1)[1]} SET synchronous_commit = on")
    mark = uuid.uuid4().hex
    live = start(tmp_path, pg_url, mark)
    codes: list[tuple[float, int]] = []
    accepted: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                response = submit(live, prompt="edit")
            except httpx.HTTPError:
                time.sleep(0.02)
                continue
            codes.append((time.monotonic(), response.status_code))
            if response.status_code == 200:
                accepted.append(response.json()["id"])
            time.sleep(0.02)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        for mode in ("fast", "immediate"):
            time.sleep(1.0)
            subprocess.run(
                _as_postgres(
                    [
                        _find("pg_ctl"),
                        "-D",
                        str(pg_server.datadir),
                        "-l",
                        str(pg_server.datadir.parent / "log"),
                        "-m",
                        mode,
                        "-w",
                        "-t",
                        "60",
                        "restart",
                    ]
                ),
                check=True,
                capture_output=True,
            )
            back = time.monotonic()
            deadline = back + 30
            while not any(t > back and code == 200 for t, code in codes):
                assert time.monotonic() < deadline, "submits never succeeded again"
                time.sleep(0.02)
            first_ok = min(t for t, code in codes if t > back and code == 200)
            took = first_ok - back
            print(f"\n[faults] PostgreSQL restart ({mode}): back to first submit {took:.2f} s")
    finally:
        stop.set()
        thread.join()
    try:
        # Refused submits were 503, never 500; every accepted task ends and is billed once.
        log = live.log()
        assert {code for _, code in codes} <= {200, 503}, _unhandled(log)
        assert 503 in {code for _, code in codes}
        outcomes = wait_terminal(live, accepted)
        assert {data["status"] for data in outcomes.values()} == {"completed"}
        assert_balanced(live, outcomes, None)
    finally:
        stop_service(live)
    assert_generation_gone(mark)


def test_backlog_several_times_the_deadline(tmp_path: Path, db_url: str | None) -> None:
    mark = uuid.uuid4().hex
    live = start(tmp_path, db_url, mark, GENHOOK_TEST_DEADLINE="5")
    try:
        warm = submit_ok(live, prompt="sleep=0.4")
        wait_terminal(live, [warm])
        # About 12 s of work for one worker, against a 5 s deadline.
        ids = [warm, *(submit_ok(live, prompt="sleep=0.4") for _ in range(30))]
        outcomes = wait_terminal(live, ids, timeout=40)
        # Polling shows a timeout as failed with error_code 4002.
        statuses = [
            "timeout" if data.get("error_code") == 4002 else data["status"]
            for data in outcomes.values()
        ]
        assert set(statuses) == {"completed", "timeout"}
        # No task was started without time to finish: no engine abandoned, no restart.
        assert "exited with" not in live.log()
        assert_balanced(live, outcomes, None)
        print(
            f"\n[faults] backlog: {statuses.count('completed')} completed, "
            f"{statuses.count('timeout')} timed out unbilled"
        )
    finally:
        stop_service(live)
    assert_generation_gone(mark)


def test_sigterm_with_tasks_in_flight(tmp_path: Path, db_url: str | None) -> None:
    mark = uuid.uuid4().hex
    env = {"GENHOOK_WORKERS": "2", "GENHOOK_SHUTDOWN_GRACE_SECONDS": "20"}
    live = start(tmp_path, db_url, mark, **env)
    running = [submit_ok(live, prompt="sleep=4") for _ in range(2)]
    for task_id in running:
        worker_pid(live, db_url, task_id)
    queued = [submit_ok(live, prompt="sleep=4") for _ in range(4)]
    before = task_rows(live, db_url)
    asked = time.monotonic()
    live.process.send_signal(signal.SIGTERM)
    assert live.process.wait(30) == 0
    print(f"\n[faults] SIGTERM with 2 tasks in flight: exited in {time.monotonic() - asked:.2f} s")
    assert_generation_gone(mark)
    rows = task_rows(live, db_url)
    # In-flight tasks finished; nothing waiting was claimed once the signal arrived.
    assert [rows[t].status for t in running] == ["completed", "completed"]
    waiting = [t for t in queued if before[t].status == "created"]
    assert waiting and [(rows[t].status, rows[t].attempts) for t in waiting] == [
        ("created", 0)
    ] * len(waiting)
    # Billed exactly what completed.
    completed = sorted(t for t, row in rows.items() if row.status == "completed")

    async def billed() -> list[str]:
        db = Database(db_url or f"sqlite+aiosqlite:///{live.data_dir / 'genhook.db'}")
        try:
            async with db.read() as session:
                return sorted((await session.scalars(select(UsageLine.task_id))).all())
        finally:
            await db.dispose()

    assert asyncio.run(billed()) == completed


def test_shutdown_past_the_grace(tmp_path: Path, hooks: Hooks) -> None:
    """A task that outlives the grace is given back; the dispatcher still stops on its own,
    after the workers, and the whole shutdown ends a few seconds past the grace."""
    mark = uuid.uuid4().hex
    grace = 2.0
    live = start(tmp_path, None, mark, GENHOOK_SHUTDOWN_GRACE_SECONDS=str(grace))
    done = submit_ok(live, prompt="sleep=0.1", webhook_url=hooks.url)
    wait_terminal(live, [done])
    stuck = submit_ok(live, prompt="sleep=60", webhook_url=hooks.url)
    worker_pid(live, None, stuck)
    asked = time.monotonic()
    live.process.send_signal(signal.SIGTERM)
    assert live.process.wait(60) == 0
    took = time.monotonic() - asked
    print(f"\n[faults] SIGTERM with a task past the {grace:g} s grace: exited in {took:.2f} s")
    assert_generation_gone(mark)
    log = live.log()
    assert "dispatcher-0 did not stop in time" not in log, log[-3000:]
    rows = task_rows(live, None)
    assert (rows[stuck].status, rows[stuck].lease_losses) == ("created", 0)
    assert hooks.ids == {done: 1}
