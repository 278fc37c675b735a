"""The CLI as a newcomer meets it next to ``genhook serve``: credentials found, values whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveService, start_service, stop_service
from tests.support.images import data_url

MODEL = "test/fake-edit"


def run_cli(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genhook.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def bare_env(service: LiveService, **extra: str) -> dict[str, str]:
    """The user's shell: no key in the environment, a narrow terminal."""
    env = {k: v for k, v in service.env.items() if k not in ("GENHOOK_API_KEY", "GENHOOK_DATA_DIR")}
    env.update(GENHOOK_BASE_URL=service.base_url, COLUMNS="40", **extra)
    return env


def completed_task(service: LiveService) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {service.api_key}"}
    task = httpx.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json={"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"},
        headers=headers,
        timeout=10,
    ).json()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result: dict[str, Any] = httpx.get(task["urls"]["get"], headers=headers, timeout=10).json()
        if result["status"] == "completed":
            return result
        time.sleep(0.05)
    raise AssertionError(f"task never completed:\n{service.log()[-3000:]}")


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One ``serve`` for the tests that only read from it and add keys."""
    service = start_service(tmp_path_factory.mktemp("first-hour"))
    yield service
    stop_service(service)


def test_cli_finds_the_local_credentials_and_prints_whole_values(
    live_service: LiveService, tmp_path: Path
) -> None:
    result = completed_task(live_service)
    # From the directory `make serve` ran in: ./genhook-data/credentials.json.
    workdir = tmp_path / "checkout"
    (workdir / "genhook-data").mkdir(parents=True)
    shutil.copy(live_service.data_dir / "credentials.json", workdir / "genhook-data")
    shown = run_cli(bare_env(live_service), "result", result["id"], cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    found = (workdir / "genhook-data" / "credentials.json").resolve()
    assert f"using the API key from {found}" in shown.stderr
    # A 40-column terminal neither folds nor cuts the output URL.
    assert any(result["outputs"][0] in line for line in shown.stdout.splitlines()), shown.stdout
    # With GENHOOK_DATA_DIR pointing at the service's data, from anywhere.
    env = bare_env(live_service, GENHOOK_DATA_DIR=str(live_service.data_dir))
    assert run_cli(env, "result", result["id"], cwd=tmp_path).returncode == 0
    # No credentials to find: the service's 401, not a made-up key.
    missing = run_cli(bare_env(live_service), "result", result["id"], cwd=tmp_path)
    assert missing.returncode == 3 and "401" in missing.stderr
    # An explicit key wins and nothing is looked up.
    explicit = run_cli(
        bare_env(live_service, GENHOOK_API_KEY=live_service.api_key), "result", result["id"]
    )
    assert explicit.returncode == 0 and "using the API key" not in explicit.stderr


def test_tables_keep_ids_whole_in_a_narrow_terminal(live_service: LiveService) -> None:
    created = json.loads(live_service.cli("keys", "create", "default", "--json").stdout)
    listed = run_cli({**live_service.env, "COLUMNS": "40"}, "keys", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(created["key_id"] in line for line in listed.stdout.splitlines()), listed.stdout


def test_serve_dev_accepts_local_webhooks_and_prints_listen(tmp_path: Path) -> None:
    env = {"GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "false"}
    (tmp_path / "dev").mkdir()
    (tmp_path / "plain").mkdir()
    live = start_service(tmp_path / "dev", args=("--dev",), **env)
    try:
        assert f"genhook listen --base-url {live.base_url} --port 4242" in live.log()
        response = httpx.post(
            f"{live.base_url}/api/v1/model/generateImage",
            json={
                "model": MODEL,
                "prompt": "edit",
                "images": [data_url()],
                "size": "1024*1024",
                "webhook_url": "http://127.0.0.1:4242/hook",
            },
            headers={"Authorization": f"Bearer {live.api_key}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
    finally:
        stop_service(live)
    plain = start_service(tmp_path / "plain", **env)
    try:
        response = httpx.post(
            f"{plain.base_url}/api/v1/model/generateImage",
            json={
                "model": MODEL,
                "prompt": "edit",
                "images": [data_url()],
                "webhook_url": "http://127.0.0.1:4242/hook",
            },
            headers={"Authorization": f"Bearer {plain.api_key}"},
            timeout=10,
        )
        assert response.status_code == 400
        assert "must use https" in response.json()["message"]
        assert "not a routable public address" in response.json()["message"]
        assert "genhook serve --dev" in response.json()["message"]
    finally:
        stop_service(plain)
