"""Shared fixtures: databases (SQLite and a real PostgreSQL), settings, the app in-process,
and the whole service as a subprocess (``live_service``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from genhook.accounts import NewAccount, create_account
from genhook.api import AppState, build_state, create_app
from genhook.config import Settings
from genhook.db import Database
from genhook.db import database as db_database
from genhook.engines.registry import build_registry
from genhook.sender.keys import load_encryption_key
from genhook.tasks import Worker
from tests.support import netguard
from tests.support.http import HTTP
from tests.support.leftovers import start_run
from tests.support.migrated import migrate
from tests.support.postgres import PostgresServer, free_port, running_postgres
from tests.support.s3 import Partition, S3Server, running_s3

ROOT = Path(__file__).resolve().parent.parent
NETGUARD = ROOT / "tests" / "support" / "netguard"

# Keep the whole run on loopback, in this process and in every Python process it starts.
netguard.install()
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(NETGUARD), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)


# The run's temporary directory, in the process that made it (tests/support/leftovers.py).
_run_directory: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _run_directory
    _run_directory = start_run()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _run_directory is not None:
        shutil.rmtree(_run_directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback, for the bucket blob store (tests/support/s3.py)."""
    with running_s3() as server:
        yield server


@pytest.fixture
def partition(s3_server: S3Server) -> Iterator[Partition]:
    """The S3 server behind a relay whose network a test can cut and heal."""
    relay = Partition(s3_server)
    yield relay
    relay.cut()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh, empty PostgreSQL database for one test."""
    name = "t_" + uuid.uuid4().hex[:12]
    pg_server.psql(f"CREATE DATABASE {name}")
    return pg_server.url(name)


@pytest.fixture
def no_idle_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pooled PostgreSQL connections count as recently used for a minute, so no ping at
    checkout replaces one the server dropped before a test's transaction meets it."""
    monkeypatch.setattr(db_database, "PING_AFTER_IDLE_SECONDS", 60.0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'genhook.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'genhook.db'}"


# For tests that count a worker's transactions: no heartbeat or cancel check of a running
# task inside the count, however slow the machine (each is a transaction of its own).
QUIET_KEEPER: dict[str, Any] = {"lease_seconds": 60.0, "cancel_check_seconds": 30.0}


def make_settings(tmp_path: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": database_url,
        "public_base_url": "http://testserver",
        "extra_engines": ["tests.support.engines:register"],
        "webhook_allow_private_targets": True,
        "lease_seconds": 5.0,
        "sweep_interval_seconds": 0.2,
        "worker_poll_seconds": 0.02,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path, database_url)


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    migrate(settings.resolved_database_url)
    database = Database(settings.resolved_database_url)
    yield database
    await database.dispose()


@dataclass
class Harness:
    """The app in-process over ASGI, an account with its key, and a worker to run tasks."""

    state: AppState
    client: httpx.AsyncClient
    account: NewAccount
    worker: Worker
    headers: dict[str, str] = field(default_factory=dict)

    async def submit(self, body: dict[str, Any], path: str = "generateImage") -> httpx.Response:
        return await self.client.post(f"/api/v1/model/{path}", json=body, headers=self.headers)

    async def result(self, task_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/api/v1/model/result/{task_id}", headers=self.headers)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    async def run_all(self) -> int:
        ran = 0
        while await self.worker.run_turn():
            ran += 1
        return ran


async def make_harness(settings: Settings) -> Harness:
    migrate(settings.resolved_database_url)
    state = build_state(settings, registry=build_registry(settings))
    app = create_app(state)
    account = await create_account(state.db, "test", encryption_key=load_encryption_key(settings))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    worker = Worker.sharing(state, worker_id="w-test")
    return Harness(state, client, account, worker, {"Authorization": f"Bearer {account.api_key}"})


@pytest.fixture
async def harness(settings: Settings) -> AsyncIterator[Harness]:
    h = await make_harness(settings)
    yield h
    await h.client.aclose()
    await h.state.db.dispose()


@dataclass
class LiveService:
    """``genhook serve`` running as a real subprocess on loopback."""

    base_url: str
    api_key: str
    account_id: str
    signing_secret: str
    data_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "genhook.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def as_new_account(self) -> LiveService:
        """The same service seen by a new account of its own, so that tests sharing one
        ``serve`` (a module-scoped fixture) never see each other's tasks, usage or limits."""
        created = self.cli("accounts", "create", "t-" + uuid.uuid4().hex[:10], "--json")
        assert created.returncode == 0, created.stdout + created.stderr
        account = json.loads(created.stdout)
        return replace(
            self,
            api_key=account["api_key"],
            account_id=account["account_id"],
            signing_secret=account["signing_secret"],
        )


def start_service(
    tmp_path: Path, database_url: str | None = None, *, args: tuple[str, ...] = (), **env: str
) -> LiveService:
    port = free_port()
    data_dir = tmp_path / "service-data"
    full_env = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(data_dir),
        "GENHOOK_PORT": str(port),
        "GENHOOK_HOST": "127.0.0.1",
        "GENHOOK_WORKERS": "1",
        "GENHOOK_EXTRA_ENGINES": '["tests.support.engines:register"]',
        "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "GENHOOK_LEASE_SECONDS": "2",
        "GENHOOK_SWEEP_INTERVAL_SECONDS": "0.2",
        "GENHOOK_WORKER_POLL_SECONDS": "0.02",
        "GENHOOK_SHUTDOWN_GRACE_SECONDS": "10",
        # The netguard and this checkout first (set above), then whatever the run was given.
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ["PYTHONPATH"]]),
        **env,
    }
    if database_url:
        full_env["GENHOOK_DATABASE_URL"] = database_url
    log_path = tmp_path / "service.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", "serve", *args],
        env=full_env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("genhook serve exited:\n" + log_path.read_text(errors="replace"))
        try:
            if HTTP.get(base_url + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    else:
        process.kill()
        raise RuntimeError("genhook serve did not become ready:\n" + log_path.read_text())
    credentials = json.loads((data_dir / "credentials.json").read_text())
    return LiveService(
        base_url=base_url,
        api_key=credentials["api_key"],
        account_id=credentials["account_id"],
        signing_secret=credentials["signing_secret"],
        data_dir=data_dir,
        env=full_env,
        process=process,
        log_path=log_path,
    )


def stop_service(service: LiveService) -> None:
    if service.process.poll() is None:
        service.process.terminate()
        try:
            service.process.wait(30)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait(5)


def live_database(request: pytest.FixtureRequest) -> str | None:
    """The database of a live service parametrized on ``sqlite``/``postgres``: None (SQLite in
    its data directory) or a new PostgreSQL database; usable from a module-scoped fixture."""
    if request.param == "sqlite":
        return None
    server: PostgresServer = request.getfixturevalue("pg_server")
    name = "t_" + uuid.uuid4().hex[:12]
    server.psql(f"CREATE DATABASE {name}")
    return server.url(name)


@pytest.fixture
def live_service(tmp_path: Path) -> Iterator[LiveService]:
    service = start_service(tmp_path)
    yield service
    stop_service(service)
