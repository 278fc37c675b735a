"""Upstream models in ``genhook serve``: real worker processes, real HTTP, both databases."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from genhook.errors import ErrorCode
from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.upstream_server import CREDENTIAL, upstream_in_thread


def submit(service: LiveService, prompt: str) -> str:
    response = HTTP.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json={
            "model": "up/edit",
            "prompt": prompt,
            "images": [data_url()],
            "size": "1024*1024",
            "webhook_url": "http://127.0.0.1:9/hook",
        },
        headers={"Authorization": f"Bearer {service.api_key}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


def wait(service: LiveService, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result: dict[str, Any] = HTTP.get(
            f"{service.base_url}/api/v1/model/result/{task_id}",
            headers={"Authorization": f"Bearer {service.api_key}"},
            timeout=10,
        ).json()
        if result["status"] not in ("created", "processing"):
            return result
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} did not end:\n{service.log()[-3000:]}")


def test_upstream_model_in_a_live_service_never_leaks_its_credential(
    tmp_path: Path, database_url: str
) -> None:
    with upstream_in_thread() as upstream:
        models = [
            {
                "id": "up/edit",
                "adapter": "openai-images",
                "base_url": upstream.base_url,
                "credential_env": "GENHOOK_TEST_UPSTREAM_KEY",
                "retry_base_seconds": 0.01,
                "max_attempts": 2,
                "detect_nsfw": False,
                "concurrency": 4,
            }
        ]
        service = start_service(
            tmp_path,
            database_url,
            GENHOOK_UPSTREAM_MODELS=json.dumps(models),
            GENHOOK_TEST_UPSTREAM_KEY=CREDENTIAL,
            # This test process's path (the netguard, the tests, and the code under test).
            PYTHONPATH=os.environ["PYTHONPATH"],
        )
        try:
            ids = {prompt: submit(service, prompt) for prompt in ("fine", "reject", "down")}
            results = {prompt: wait(service, task_id) for prompt, task_id in ids.items()}
        finally:
            stop_service(service)
    assert results["fine"]["status"] == "completed"
    assert results["reject"]["error_code"] == ErrorCode.UPSTREAM_REJECTED
    assert results["down"]["error_code"] == ErrorCode.UPSTREAM_UNAVAILABLE
    assert all(auth == f"Bearer {CREDENTIAL}" for auth in upstream.authorizations)
    log = service.log()
    assert "upstream up/edit: attempt 1 failed" in log
    assert CREDENTIAL not in log
    assert CREDENTIAL not in json.dumps(results)
