"""The whole service as a user runs it: ``genhook serve`` in a subprocess, real HTTP."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.conftest import LiveService, live_database, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url

MODEL = "test/fake-edit"


def submit(service: LiveService, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"}
    body.update(fields)
    response = HTTP.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json=body,
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def poll(service: LiveService, task_id: str, until: tuple[str, ...], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = HTTP.get(
            f"{service.base_url}/api/v1/model/result/{task_id}",
            headers={"Authorization": f"Bearer {service.api_key}"},
            timeout=10,
        ).json()
        if result["status"] in until:
            return result
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {until}:\n{service.log()[-3000:]}")


def role_pids(service: LiveService, role: str = "worker") -> list[int]:
    """The supervisor's children running ``role``."""
    out = subprocess.run(
        ["pgrep", "-P", str(service.process.pid)], capture_output=True, text=True
    ).stdout
    pids = []
    for pid in out.split():
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"genhook.runtime.lifeline" in args and role.encode() in args:
                pids.append(int(pid))
    return pids


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One ``serve`` per database for this module's tests: each kill below is one the
    supervisor recovers from, which the next test then relies on."""
    live = start_service(tmp_path_factory.mktemp("serve"), live_database(request))
    yield live
    stop_service(live)


def test_first_start_bootstraps_and_serves_a_task(service: LiveService) -> None:
    mode = (service.data_dir / "credentials.json").stat().st_mode & 0o777
    assert mode == 0o600
    assert "Created the default account" in service.log()
    assert service.api_key in service.log()
    task = submit(service)
    result = poll(service, task["id"], ("completed", "failed"))
    assert result["status"] == "completed", result
    image = HTTP.get(result["outputs"][0], timeout=10)
    assert image.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(image.content)) as img:
        assert img.size == (1024, 1024)


def test_killed_worker_task_is_retried_by_another(service: LiveService) -> None:
    task = submit(service, prompt="sleep=3")
    poll(service, task["id"], ("processing",))
    (victim,) = role_pids(service)
    os.kill(victim, signal.SIGKILL)
    result = poll(service, task["id"], ("completed", "failed"), timeout=90)
    assert result["status"] == "completed", result
    assert result["info"]["pid"] != victim
    assert "lost its lease" in service.log()


def test_deadline_ends_task_as_timeout(tmp_path: Path) -> None:
    live = start_service(tmp_path, GENHOOK_TEST_DEADLINE="1")
    try:
        # Warm the worker on the shipped engine (its deadline is minutes), so the slow task
        # below is claimed at once and overruns in the worker, not in the queue.
        warm = submit(live, model="genhook/image-edit", prompt="black and white")
        assert poll(live, warm["id"], ("completed", "failed"), timeout=90)["status"] == "completed"
        task = submit(live, prompt="sleep=4")
        result = poll(live, task["id"], ("failed", "completed"), timeout=30)
        assert result["status"] == "failed" and result["error_code"] == 4002
        # The worker whose engine overran is replaced, and the next task still runs.
        quick = submit(live, model="genhook/image-edit", prompt="invert")
        done = poll(live, quick["id"], ("completed", "failed"), timeout=90)
        assert done["status"] == "completed", done
        assert "exited with 3; restarting" in live.log()
    finally:
        stop_service(live)


def test_sigterm_finishes_in_flight_work(tmp_path: Path) -> None:
    live = start_service(tmp_path)
    task = submit(live, prompt="sleep=1.5")
    poll(live, task["id"], ("processing",))
    live.process.send_signal(signal.SIGTERM)
    assert live.process.wait(40) == 0
    restarted = start_service(tmp_path)
    try:
        assert poll(restarted, task["id"], ("completed",), timeout=5)["status"] == "completed"
        assert "Created the default account" not in restarted.log()
    finally:
        stop_service(restarted)


def test_ctrl_c_stops_every_role_gracefully(tmp_path: Path) -> None:
    """A terminal's Ctrl-C is SIGINT to every process of its foreground group: the supervisor
    and each child, and the supervisor then sends each child its own SIGTERM. The API takes
    the two as one request to stop, not as the second one that stops at once: it finishes
    its requests and its application shutdown (closing the database and the blob store)."""
    live = start_service(tmp_path)
    children = subprocess.run(
        ["pgrep", "-P", str(live.process.pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(children) >= 3, live.log()
    for pid in [live.process.pid, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
    assert live.process.wait(40) == 0
    log = live.log()
    assert "Application shutdown complete" in log, log[-3000:]
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_cli_accounts_and_keys(service: LiveService) -> None:
    live_service = service
    created = live_service.cli("accounts", "create", "acme", "--json")
    assert created.returncode == 0, created.stderr
    account = json.loads(created.stdout)
    assert set(account) == {"account_id", "api_key", "signing_secret"}
    key = json.loads(live_service.cli("keys", "create", "acme", "--json").stdout)
    listed = json.loads(live_service.cli("keys", "list", "--account", "acme", "--json").stdout)
    assert {item["key_id"] for item in listed} >= {key["key_id"]}
    assert all(key["api_key"] not in json.dumps(item) for item in listed)
    url = f"{live_service.base_url}/api/v1/usage"
    headers = {"Authorization": f"Bearer {key['api_key']}"}
    assert HTTP.get(url, headers=headers).status_code == 200
    revoked = live_service.cli("keys", "revoke", key["key_id"])
    assert revoked.returncode == 0, revoked.stderr
    deadline = time.monotonic() + 5  # auth_cache_seconds (2 s) plus slack
    while HTTP.get(url, headers=headers).status_code != 401:
        assert time.monotonic() < deadline, "revoked key still accepted"
        time.sleep(0.1)
    assert live_service.cli("keys", "revoke", "key_missing").returncode == 1
    assert live_service.cli("keys", "create", "nobody").returncode == 1


def test_serve_restarts_a_killed_child_of_each_kind(service: LiveService) -> None:
    from tests.acceptance.test_faults import Hooks

    for role in ("api", "worker", "dispatcher"):
        restarted = f"{role}-0 exited with -9; restarting"
        before = service.log().count(restarted)  # the shared service may have seen kills
        (victim,) = role_pids(service, role)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while [pid for pid in role_pids(service, role) if pid != victim] == []:
            assert time.monotonic() < deadline, service.log()[-3000:]
            time.sleep(0.05)
        assert service.log().count(restarted) == before + 1
    # The port stayed open: the new API answers what waited for it.
    assert HTTP.get(f"{service.base_url}/readyz", timeout=60).status_code == 200
    # The new generation serves, computes and delivers.
    hooks = Hooks()
    try:
        task = submit(service, webhook_url=hooks.url)
        assert poll(service, task["id"], ("completed", "failed"))["status"] == "completed"
        deadline = time.monotonic() + 30
        while task["id"] not in hooks.ids:
            assert time.monotonic() < deadline, service.log()[-3000:]
            time.sleep(0.05)
    finally:
        hooks.close()
