"""Many nodes on one PostgreSQL and one S3 server, while processes die and the database restarts.

Two api, two worker and two dispatcher processes, each with its own data directory (they
share no disk: blobs go to the S3 server, the encryption key comes from the environment),
take 400 tasks with webhooks. A receiver fails 30% of requests; a loop kills a role process
with SIGKILL every 2 seconds (each of the six once per round, in a random order, each once it
runs again after its last kill) and starts it again, until the submits are done, a whole
round has been killed and PostgreSQL has been restarted (fast) once. At the end the books
must balance: every accepted task is terminal, every terminal task has an acknowledged
delivery, and usage lines equal completed tasks. Duplicate deliveries (a receipt whose
acknowledgement died with its dispatcher) are counted and printed, as the contract allows them.

The commands it runs are the many-machine layout of docs/operations.md.
"""

from __future__ import annotations

import base64
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
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.postgres import PostgresServer, free_port, running_postgres
from tests.support.s3 import S3_ENV, S3Server

# 1,000 tasks at 50/s took about 2 minutes alone on 2 cores and 181 s in the suite; the
# faults do not grow with the count, so 400 at 20/s: the submits still span every kind of
# fault (at least one round of kills and the restart, which the loop waits for). The budget
# stays well above, since a busier machine restarts the roles more slowly.
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(900)]

TASKS = 400
SUBMIT_RATE = 20.0  # tasks/s at most, spread over the two api processes
# Clients submitting at once, each going to the other api node at once when one is down and
# pausing only when both are. A role restarts in seconds on a busy machine, so both api nodes
# are often down together: four clients that paused after every refusal took 140-216 s to
# offer 1,000 tasks alone on 2 cores, sixteen 57 s (and the kills go on all that time).
SUBMITTERS = 16
RESTART_DATABASE_AFTER_SECONDS = 15.0
KILL_EVERY_SECONDS = 2.0
FAIL_SHARE = 0.3
SETTLE_SECONDS = 150.0


# -- the receiver (the outside world) ------------------------------------------------------


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    refused: int = 0
    acknowledged: Counter[str] = field(default_factory=Counter)  # delivery id -> 2xx sent
    tasks: set[str] = field(default_factory=set)


def start_receiver(tally: Tally) -> tuple[ThreadingHTTPServer, int]:
    rng = random.Random(7)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            delivery = self.headers.get("X-Service-Webhook-Id", "")
            with tally.lock:
                tally.requests += 1
                fail = rng.random() < FAIL_SHARE
                if fail:
                    tally.refused += 1
                else:
                    tally.acknowledged[delivery] += 1
                    tally.tasks.add(json.loads(body)["session_id"])
            self.send_response(500 if fail else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


# -- the nodes ---------------------------------------------------------------------------------


@dataclass
class Role:
    """One role process of one node, restartable with the same name, port and data directory."""

    name: str
    role: str
    env: dict[str, str]
    log_path: Path
    port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "genhook.cli", self.role],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL for the whole process group if it lingers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(10)

    def ready(self) -> bool:
        if self.port is None:
            return self.process is not None and self.process.poll() is None
        try:
            return HTTP.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def node_env(
    tmp_path: Path, name: str, database_url: str, bucket: tuple[str, str], key: str, port: int
) -> dict[str, str]:
    endpoint, store = bucket
    return {
        **os.environ,
        **S3_ENV,
        "GENHOOK_DATA_DIR": str(tmp_path / name),
        "GENHOOK_DATABASE_URL": database_url,
        "GENHOOK_BLOB_STORE": store,
        "GENHOOK_S3_ENDPOINT_URL": endpoint,
        "GENHOOK_WEBHOOK_ENCRYPTION_KEY": key,
        "GENHOOK_HOST": "127.0.0.1",
        "GENHOOK_PORT": str(port),
        "GENHOOK_HEALTH_PORT": str(port),
        "GENHOOK_EXTRA_ENGINES": '["tests.support.engines:register"]',
        "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "GENHOOK_LEASE_SECONDS": "3",
        "GENHOOK_MAX_LEASE_LOSSES": "20",
        "GENHOOK_SWEEP_INTERVAL_SECONDS": "0.5",
        "GENHOOK_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
        "GENHOOK_WEBHOOK_RETRY_CAP_SECONDS": "2",
        "GENHOOK_WEBHOOK_RETRY_MAX_ATTEMPTS": "50",
        "GENHOOK_WEBHOOK_RECONCILE_INTERVAL_SECONDS": "2",
        "GENHOOK_WEBHOOK_BREAKER_FAILURES": "1000",
        "GENHOOK_SHUTDOWN_GRACE_SECONDS": "5",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ["PYTHONPATH"]]),
    }


@pytest.fixture
def cluster(
    tmp_path: Path, s3_server: S3Server
) -> Iterator[tuple[PostgresServer, list[Role], str]]:
    key = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    # Its own PostgreSQL: the test restarts it.
    with running_postgres() as pg:
        pg.psql("CREATE DATABASE genhook")
        url = pg.url("genhook")
        s3 = (s3_server.endpoint_url, f"s3://{s3_server.new_bucket()}/multinode")
        env = node_env(tmp_path, "admin", url, s3, key, free_port())
        subprocess.run(
            [sys.executable, "-m", "genhook.cli", "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        roles: list[Role] = []
        for role in ("api", "worker", "dispatcher"):
            for index in (1, 2):
                name = f"{role}-{index}"
                port = free_port()
                roles.append(
                    Role(
                        name,
                        role,
                        node_env(tmp_path, name, url, s3, key, port),
                        tmp_path / f"{name}.log",
                        port=port,
                    )
                )
        try:
            for role_process in roles:
                role_process.start()
            deadline = time.monotonic() + 90
            while not all(r.ready() for r in roles):
                assert time.monotonic() < deadline, "the roles did not become ready:\n" + logs(
                    roles
                )
                time.sleep(0.2)
            yield pg, roles, key
        finally:
            for role_process in roles:
                role_process.stop()


def logs(roles: list[Role]) -> str:
    return "\n".join(
        f"--- {r.name}\n{r.log_path.read_text(errors='replace')[-3000:]}"
        for r in roles
        if r.log_path.exists()
    )


def create_account(env: dict[str, str]) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "genhook.cli", "accounts", "create", "multinode", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    created = json.loads(out.stdout)
    return str(created["account_id"]), str(created["api_key"])


# -- the run -------------------------------------------------------------------------------------


def test_multinode_survives_kills_and_a_database_restart(
    cluster: tuple[PostgresServer, list[Role], str], tmp_path: Path
) -> None:
    pg, roles, _ = cluster
    apis = [r for r in roles if r.role == "api"]
    _, api_key = create_account(apis[0].env)
    tally = Tally()
    receiver, receiver_port = start_receiver(tally)
    body = {
        "model": "test/fake-edit",
        "prompt": "multinode",
        "images": [data_url(size=64)],
        "size": "1024*1024",
        "webhook_url": f"http://127.0.0.1:{receiver_port}/hook",
    }
    accepted: list[str] = []
    stop_killing = threading.Event()
    all_submitted = threading.Event()  # else a failed submit stops the kills at once
    kills: list[str] = []
    retries: Counter[str] = Counter()  # why submits were tried again (printed, approximate)

    def killer() -> None:
        rng = random.Random(11)
        restarted_db = False
        started = time.monotonic()
        victims: list[Role] = []
        rounds = 0

        def go_on() -> bool:
            """Until the submits are done and every fault has happened at least once."""
            if not stop_killing.is_set():
                return True
            return all_submitted.is_set() and not (restarted_db and rounds > 0)

        while go_on():
            time.sleep(KILL_EVERY_SECONDS)
            if not victims:  # every process once per round, in a random order
                victims = rng.sample(roles, len(roles))
            victim = victims.pop()
            # Each kill hits a running process: on a loaded machine a role may take longer to
            # start than a round of kills lasts, and killed again while starting it never runs.
            started_by = time.monotonic() + 60
            while not victim.ready() and time.monotonic() < started_by and go_on():
                time.sleep(0.2)
            if not go_on():
                break
            victim.kill()
            kills.append(victim.name)
            victim.start()
            if not victims:
                rounds += 1
            if not restarted_db and time.monotonic() - started > RESTART_DATABASE_AFTER_SECONDS:
                pg.restart()
                restarted_db = True
                kills.append("postgresql")

    killing = threading.Thread(target=killer, daemon=True)
    killing.start()
    try:
        with (
            httpx.Client(timeout=10, headers={"Authorization": f"Bearer {api_key}"}) as http,
            ThreadPoolExecutor(SUBMITTERS) as submitters,
        ):
            started = time.monotonic()

            def paced(n: int) -> str:
                time.sleep(max(0.0, started + n / SUBMIT_RATE - time.monotonic()))
                return submit(http, apis, n, body, retries)

            accepted.extend(submitters.map(paced, range(TASKS)))
        all_submitted.set()
    finally:
        stop_killing.set()
        killing.join(120)
    for role in roles:  # the last victim may still be starting
        if role.process is None or role.process.poll() is not None:
            role.start()

    submitted = time.monotonic()
    settled = wait_settled(pg, accepted, tally)
    receiver.shutdown()
    statuses, usage, per_task_usage, acked_tasks = settled
    duplicates = sum(count - 1 for count in tally.acknowledged.values() if count > 1)
    print(
        f"\nmultinode: {len(accepted)} accepted, statuses {dict(statuses)}, "
        f"{sum(usage.values())} usage lines, {tally.requests} webhook requests "
        f"({tally.refused} refused by the receiver), {duplicates} duplicate deliveries, "
        f"kills: {len(kills)} ({dict(Counter(kills))}); submitting took "
        f"{submitted - started:.1f} s (retries: {dict(retries)}), settling "
        f"{time.monotonic() - submitted:.1f} s"
    )
    assert len(set(accepted)) == TASKS, "an Idempotency-Key retry made a second task"
    assert sum(statuses.values()) == TASKS, statuses
    assert set(statuses) <= {"completed", "failed", "timeout"}, logs(roles)
    # Every terminal task with a webhook_url has at least one acknowledged delivery.
    assert acked_tasks == set(accepted), f"{len(set(accepted) - acked_tasks)} never acknowledged"
    assert set(accepted) <= tally.tasks
    # No double billing: one usage line per completed task, none for the others.
    assert per_task_usage == {t: 1 for t in per_task_usage}
    assert sum(usage.values()) == statuses.get("completed", 0)


def submit(
    http: httpx.Client, apis: list[Role], n: int, body: dict[str, Any], retries: Counter[str]
) -> str:
    """Submit once under an Idempotency-Key, retrying across the api nodes until one answers."""
    key = str(uuid.uuid4())
    deadline = time.monotonic() + 60
    attempt = 0
    while True:
        api = apis[(n + attempt) % len(apis)]
        attempt += 1
        try:
            response = http.post(
                f"http://127.0.0.1:{api.port}/api/v1/model/generateImage",
                json=body,
                headers={"Idempotency-Key": key},
            )
            if response.status_code == 200:
                return str(response.json()["id"])
            assert response.status_code in (429, 502, 503), response.text
            retries[str(response.status_code)] += 1
        except httpx.TransportError as exc:
            retries[type(exc).__name__] += 1
        assert time.monotonic() < deadline, f"task {n} could not be submitted"
        if attempt % len(apis) == 0:  # the other node at once; a pause once both failed
            time.sleep(0.2)


def wait_settled(
    pg: PostgresServer, accepted: list[str], tally: Tally
) -> tuple[Counter[str], Counter[str], dict[str, int], set[str]]:
    """Poll the database until every task is terminal and acknowledged, or time runs out."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        statuses = Counter(
            {s: int(n) for s, n in query(pg, "SELECT status, count(*) FROM tasks GROUP BY status")}
        )
        acked = {
            row[0]
            for row in query(
                pg, "SELECT task_id FROM webhook_deliveries WHERE status = 'delivered'"
            )
        }
        terminal = sum(statuses[s] for s in ("completed", "failed", "timeout", "canceled"))
        if (terminal == len(accepted) and acked >= set(accepted)) or time.monotonic() > deadline:
            break
        time.sleep(1)
    usage = Counter({s: int(n) for s, n in query(pg, "SELECT 'lines', count(*) FROM usage_lines")})
    per_task = {
        row[0]: int(row[1])
        for row in query(pg, "SELECT task_id, count(*) FROM usage_lines GROUP BY task_id")
    }
    return statuses, usage, per_task, acked


def query(pg: PostgresServer, sql: str) -> list[tuple[str, ...]]:
    return pg.rows(sql, database="genhook")
