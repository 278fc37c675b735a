"""Wake-ups across processes, and an idle service that writes nothing, on ``genhook serve``.

The safety-net polls are set to 30 s, so a task that completes and a webhook that arrives
within a few seconds can only have been woken: the submit (API process) wakes the worker
process, and the worker's terminal transaction wakes the dispatcher in the API process.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.postgres import PostgresServer

MODEL = "test/fake-edit"
SLOW_POLLS = {
    "GENHOOK_WORKER_POLL_SECONDS": "30",
    "GENHOOK_WEBHOOK_POLL_SECONDS": "30",
    "GENHOOK_SWEEP_INTERVAL_SECONDS": "1",
}


class _Hooks(BaseHTTPRequestHandler):
    arrived: list[tuple[float, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.arrived.append((time.monotonic(), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[float, bytes]]]]:
    arrived: list[tuple[float, bytes]] = []
    handler = type("Hooks", (_Hooks,), {"arrived": arrived})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", arrived
    server.shutdown()
    server.server_close()
    thread.join(5)


def _listening(service: LiveService, pg: PostgresServer | None, database: str) -> int:
    """Wake-up listeners the service has open: sockets on SQLite, LISTEN connections on
    PostgreSQL."""
    if pg is None:
        return sum(1 for _ in (service.data_dir / "wake").glob("*/*.sock"))
    import subprocess

    from tests.support.postgres import _find

    out = subprocess.run(
        [
            _find("psql"),
            *("-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", database, "-At"),
            "-c",
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN%'",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> tuple[str | None, PostgresServer | None]:
    if request.param == "sqlite":
        return None, None
    url: str = request.getfixturevalue("pg_url")
    server: PostgresServer = request.getfixturevalue("pg_server")
    return url, server


def _wait_idle(service: LiveService, pg: PostgresServer | None, url: str | None) -> None:
    """Until the worker and the dispatcher listen (SQLite: a socket each; PostgreSQL: one
    connection per process), then a moment for their first claims to come back empty."""
    database = url.rsplit("/", 1)[1] if url else ""
    deadline = time.monotonic() + 60
    while _listening(service, pg, database) < 2:
        assert time.monotonic() < deadline, service.log()[-3000:]
        time.sleep(0.1)
    time.sleep(1.5)


def test_submit_and_terminal_transition_wake_other_processes(
    tmp_path: Path,
    backend: tuple[str | None, PostgresServer | None],
    receiver: tuple[str, list[tuple[float, bytes]]],
) -> None:
    url, pg = backend
    hook_url, arrived = receiver
    service = start_service(tmp_path, url, **SLOW_POLLS)
    try:
        _wait_idle(service, pg, url)
        for round_ in range(2):  # twice: the second finds both roles back in their waits
            started = time.monotonic()
            body = {
                "model": MODEL,
                "prompt": "edit",
                "images": [data_url()],
                "size": "1024*1024",
                "webhook_url": hook_url,
            }
            response = HTTP.post(
                f"{service.base_url}/api/v1/model/generateImage",
                json=body,
                headers={"Authorization": f"Bearer {service.api_key}"},
                timeout=10,
            )
            assert response.status_code == 200, response.text
            task_id = response.json()["id"]
            while len(arrived) <= round_:
                assert time.monotonic() - started < 8, (
                    "no webhook within 8 s, with 30 s polls: " + service.log()[-3000:]
                )
                time.sleep(0.02)
            assert task_id.encode() in arrived[round_][1]
            if round_ == 0:
                time.sleep(1.0)  # both roles back in their waits for the second round
    finally:
        stop_service(service)


def _pg_write_statements(pg: PostgresServer) -> int:
    log = (pg.datadir.parent / "log").read_text(errors="replace")
    return len(re.findall(r"LOG:\s+(?:statement|execute [^:]*):", log))


def test_idle_service_writes_nothing(
    tmp_path: Path, backend: tuple[str | None, PostgresServer | None]
) -> None:
    """With nothing to do, no role writes: no committed change on SQLite (data_version and
    the WAL stay put), no INSERT, UPDATE or DELETE statement at all on PostgreSQL (its
    ``log_statement = mod`` log stays put), over several sweeper, reconciler, retention and
    poll intervals."""
    url, pg = backend
    if pg is not None:
        database = url.rsplit("/", 1)[1] if url else ""
        pg.psql(f"ALTER DATABASE {database} SET log_statement = 'mod'")
    service = start_service(
        tmp_path,
        url,
        GENHOOK_WORKER_POLL_SECONDS="0.5",
        GENHOOK_WEBHOOK_POLL_SECONDS="0.5",
        GENHOOK_SWEEP_INTERVAL_SECONDS="0.2",
        GENHOOK_WEBHOOK_RECONCILE_INTERVAL_SECONDS="0.5",
        GENHOOK_RETENTION_INTERVAL_SECONDS="0.5",
    )
    try:
        _wait_idle(service, pg, url)
        if pg is None:
            path = service.data_dir / "genhook.db"
            observer = sqlite3.connect(path)
            wal = path.with_name("genhook.db-wal")

            def sample() -> tuple[int, int]:
                (version,) = observer.execute("PRAGMA data_version").fetchone()
                return int(version), wal.stat().st_size

            before = sample()
            time.sleep(4)
            assert sample() == before
            observer.close()
        else:
            before_statements = _pg_write_statements(pg)
            time.sleep(4)
            written = _pg_write_statements(pg) - before_statements
            assert written == 0, (pg.datadir.parent / "log").read_text()[-3000:]
    finally:
        stop_service(service)


def test_two_workers_a_submit_wakes_one_and_no_claim_comes_back_empty(tmp_path: Path) -> None:
    """SQLite, two worker processes, 30 s polls: each submit (made while both workers wait)
    wakes one of them alone, which claims at once; the other neither wakes nor claims."""
    service = start_service(
        tmp_path, None, GENHOOK_WORKERS="2", GENHOOK_LOG_LEVEL="DEBUG", **SLOW_POLLS
    )
    tasks = service.data_dir / "wake" / "tasks"

    def both_idle() -> None:
        deadline = time.monotonic() + 60
        while len(list(tasks.glob("*.idle.sock"))) < 2:
            assert time.monotonic() < deadline, service.log()[-3000:]
            time.sleep(0.02)

    try:
        both_idle()
        seen = len(service.log())
        rounds = 4
        for _ in range(rounds):
            started = time.monotonic()
            response = HTTP.post(
                f"{service.base_url}/api/v1/model/generateImage",
                json={"model": MODEL, "prompt": "edit", "images": [data_url()]},
                headers={"Authorization": f"Bearer {service.api_key}"},
                timeout=10,
            )
            assert response.status_code == 200, response.text
            result = f"{service.base_url}/api/v1/model/result/{response.json()['id']}"
            headers = {"Authorization": f"Bearer {service.api_key}"}
            while HTTP.get(result, headers=headers, timeout=10).json()["status"] != "completed":
                assert time.monotonic() - started < 8, (
                    "not completed within 8 s, with 30 s polls: " + service.log()[-3000:]
                )
                time.sleep(0.02)
            both_idle()
        log = service.log()[seen:]
        assert log.count("woken (targeted)") == rounds, log[-3000:]
        assert "woken (broadcast)" not in log, log[-3000:]
        assert "claim found no task" not in log, log[-3000:]
    finally:
        stop_service(service)
