"""The process roles as deployed on many machines: ``genhook api``, ``genhook worker`` and
``genhook dispatcher``, each a real process on its own, against one database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from genhook.db.migrate import upgrade
from tests.acceptance.test_faults import Hooks
from tests.conftest import ROOT
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.postgres import free_port

ROLES = ("api", "worker", "dispatcher")


@dataclass
class Role:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def role_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "GENHOOK_DATA_DIR": str(tmp_path / "data"),
        "GENHOOK_DATABASE_URL": database_url,
        "GENHOOK_HOST": "127.0.0.1",
        "GENHOOK_EXTRA_ENGINES": '["tests.support.engines:register"]',
        "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "GENHOOK_WORKER_POLL_SECONDS": "0.02",
        "GENHOOK_SHUTDOWN_GRACE_SECONDS": "10",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ["PYTHONPATH"]]),
    }


def start_role(tmp_path: Path, env: dict[str, str], name: str, *args: str) -> Role:
    """Start ``genhook NAME``; the API listens on its port, the others on a health port."""
    port = free_port()
    env = {**env, "GENHOOK_PORT" if name == "api" else "GENHOOK_HEALTH_PORT": str(port)}
    log_path = tmp_path / f"{name}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", name, *args],
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    role = Role(name, process, port, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"genhook {name} exited:\n{role.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if HTTP.get(role.base_url + "/readyz", timeout=1).status_code == 200:
                return role
        time.sleep(0.1)
    stop_role(role)
    raise AssertionError(f"genhook {name} never became ready:\n{role.log()}")


def stop_role(role: Role) -> int:
    if role.process.poll() is None:
        role.process.send_signal(signal.SIGTERM)
        try:
            role.process.wait(30)
        except subprocess.TimeoutExpired:
            role.process.kill()
            role.process.wait(5)
    code = role.process.returncode
    assert code is not None
    return code


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1][:3]
    except OSError:
        return False
    return b"Z" not in state


def create_key(env: dict[str, str]) -> str:
    """An API key of a new account, made with the CLI."""
    created = subprocess.run(
        [sys.executable, "-m", "genhook.cli", "accounts", "create", "acme", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    key: str = json.loads(created.stdout)["api_key"]
    return key


@pytest.fixture
def migrated(tmp_path: Path, database_url: str) -> dict[str, str]:
    upgrade(database_url)
    return role_env(tmp_path, database_url)


@pytest.fixture
def running() -> Iterator[list[Role]]:
    started: list[Role] = []
    yield started
    for role in started:
        stop_role(role)


@pytest.mark.parametrize("name", ROLES)
def test_role_answers_readiness_and_stops_on_sigterm(
    tmp_path: Path, migrated: dict[str, str], name: str
) -> None:
    role = start_role(tmp_path, migrated, name)
    try:
        assert HTTP.get(role.base_url + "/healthz", timeout=5).json() == {"status": "ok"}
        if name != "api":
            metrics = HTTP.get(role.base_url + "/metrics", timeout=5)
            assert metrics.status_code == 200
            assert metrics.headers["content-type"].startswith("text/plain")
            assert b"python_info" in metrics.content
        helpers = children(role.process.pid)
    finally:
        code = stop_role(role)
    assert code == 0, role.log()
    # Named by machine and process, not "worker-0" on every machine.
    assert f" {name}@{socket.gethostname()}:{role.process.pid} " in role.log(), role.log()
    assert not [pid for pid in helpers if alive(pid)]


@pytest.mark.parametrize("name", ROLES)
def test_role_refuses_an_unmigrated_database(tmp_path: Path, database_url: str, name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "genhook.cli", name],
        env=role_env(tmp_path, database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "genhook db upgrade" in result.stderr
    assert "Traceback" not in result.stderr


def test_api_worker_and_dispatcher_processes_run_a_task_and_deliver_its_webhook(
    tmp_path: Path, migrated: dict[str, str], running: list[Role]
) -> None:
    key = create_key(migrated)
    hooks = Hooks()
    try:
        api = start_role(tmp_path, migrated, "api")
        running.append(api)
        # Nothing delivers or computes yet: the API accepts the task and keeps it waiting.
        body: dict[str, Any] = {
            "model": "test/fake-edit",
            "prompt": "edit",
            "images": [data_url()],
            "size": "1024*1024",
            "webhook_url": hooks.url,
        }
        headers = {"Authorization": f"Bearer {key}"}
        submitted = HTTP.post(
            api.base_url + "/api/v1/model/generateImage", json=body, headers=headers, timeout=10
        )
        assert submitted.status_code == 200, submitted.text
        task_id = submitted.json()["id"]
        running.append(start_role(tmp_path, migrated, "worker", "--concurrency", "4"))
        running.append(start_role(tmp_path, migrated, "dispatcher"))
        deadline = time.monotonic() + 60
        while task_id not in hooks.ids:
            assert time.monotonic() < deadline, [role.log()[-2000:] for role in running]
            time.sleep(0.05)
        result = HTTP.get(
            f"{api.base_url}/api/v1/model/result/{task_id}", headers=headers, timeout=10
        ).json()
        assert result["status"] == "completed", result
        assert hooks.ids == {task_id: 1}
    finally:
        hooks.close()
    for role in running:
        assert stop_role(role) == 0, role.log()


@pytest.mark.postgres
def test_a_standalone_workers_task_runs_again_soon_after_it_dies(
    tmp_path: Path, pg_url: str, running: list[Role]
) -> None:
    """On PostgreSQL a standalone worker's database session is its liveness: killed, its task
    is requeued by the dispatcher's sweeper well before its 30 s lease runs out."""
    upgrade(pg_url)
    env = {**role_env(tmp_path, pg_url), "GENHOOK_LEASE_SECONDS": "30"}
    headers = {"Authorization": f"Bearer {create_key(env)}"}
    api = start_role(tmp_path, env, "api")
    running.append(api)
    running.append(start_role(tmp_path, env, "dispatcher"))
    for i in range(2):
        (tmp_path / f"w{i}").mkdir()
    workers = [start_role(tmp_path / f"w{i}", env, "worker") for i in range(2)]
    running.extend(workers)
    body = {"model": "test/fake-edit", "prompt": "sleep=1", "images": [data_url()]}
    submitted = HTTP.post(
        api.base_url + "/api/v1/model/generateImage", json=body, headers=headers, timeout=10
    )
    assert submitted.status_code == 200, submitted.text
    task_id = submitted.json()["id"]

    def task() -> dict[str, Any]:
        return dict(
            HTTP.get(
                f"{api.base_url}/api/v1/model/result/{task_id}", headers=headers, timeout=10
            ).json()
        )

    deadline = time.monotonic() + 60
    while task()["status"] != "processing":
        assert time.monotonic() < deadline, "the task was never claimed"
        time.sleep(0.02)
    owner = _lease_owner(pg_url, task_id)
    victim = next(w for w in workers if f":{w.process.pid}/" in owner)
    killed = time.time()
    victim.process.kill()
    victim.process.wait()
    deadline = time.monotonic() + 60
    while task()["status"] != "completed":
        assert time.monotonic() < deadline, [role.log()[-2000:] for role in running]
        time.sleep(0.05)
    started_at, losses = _run_of(pg_url, task_id)
    print(f"\n[roles] standalone worker killed to its task's re-run: {started_at - killed:.2f} s")
    assert losses == 1
    # Requeued for its worker's death, not for a lease that ran out.
    assert owner.endswith("+live")
    assert started_at < killed + 30


def _lease_owner(url: str, task_id: str) -> str:
    import asyncio

    from sqlalchemy import select

    from genhook.db import Database, Task

    async def read() -> str:
        db = Database(url)
        try:
            async with db.read() as session:
                owner = await session.scalar(select(Task.lease_owner).where(Task.id == task_id))
                return str(owner)
        finally:
            await db.dispose()

    return asyncio.run(read())


def _run_of(url: str, task_id: str) -> tuple[float, int]:
    import asyncio

    from genhook.db import Database, Task

    async def read() -> tuple[float, int]:
        db = Database(url)
        try:
            async with db.read() as session:
                row = await session.get(Task, task_id)
                assert row is not None and row.started_at is not None
                return row.started_at / 1000, row.lease_losses
        finally:
            await db.dispose()

    return asyncio.run(read())
