"""``genhook serve`` as a subprocess with its blobs in a bucket (moto's S3 server on
loopback), on SQLite and PostgreSQL: a task with an input image end to end in both output
delivery modes, and the bucket going away and coming back while a task runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveService, start_service, stop_service
from tests.support.images import data_url
from tests.support.s3 import Partition, S3Server, s3_client

MODEL = "test/fake-edit"


def bucket_env(endpoint_url: str, bucket: str, **extra: str) -> dict[str, str]:
    return {
        "GENHOOK_BLOB_STORE": f"s3://{bucket}/tasks",
        "GENHOOK_S3_ENDPOINT_URL": endpoint_url,
        "GENHOOK_S3_REGION": "us-east-1",
        "GENHOOK_S3_ADDRESSING_STYLE": "path",
        **extra,
    }


def database(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Api:
    def __init__(self, service: LiveService) -> None:
        self.service = service
        self.http = httpx.Client(
            base_url=service.base_url,
            headers={"Authorization": f"Bearer {service.api_key}"},
            timeout=30,
        )

    def submit(self, prompt: str = "edit") -> httpx.Response:
        body = {"model": MODEL, "prompt": prompt, "size": "1024*1024", "images": [data_url()]}
        return self.http.post("/api/v1/model/generateImage", json=body)

    def wait(self, task_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
        for _ in range(600):
            result: dict[str, Any] = self.http.get(f"/api/v1/model/result/{task_id}").json()
            if result["status"] in statuses:
                return result
            time.sleep(0.05)
        raise AssertionError(f"task {task_id} never reached {statuses}:\n{self.service.log()}")


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest) -> str | None:
    return database(request)


@pytest.mark.parametrize(
    ("db_url", "delivery"),
    # Redirecting to a presigned URL is the API's and the bucket's, not the database's: on
    # SQLite only (tests/integration/test_blob_store_s3.py runs both modes on both).
    [
        ("sqlite", "stream"),
        ("sqlite", "redirect"),
        pytest.param("postgres", "stream", marks=pytest.mark.postgres),
    ],
    indirect=["db_url"],
)
def test_a_task_with_an_input_image_runs_on_the_bucket(
    tmp_path: Path, db_url: str | None, delivery: str, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    env = bucket_env(s3_server.endpoint_url, bucket, GENHOOK_OUTPUT_DELIVERY=delivery)
    service = start_service(tmp_path, db_url, **env)
    try:
        api = Api(service)
        submitted = api.submit()
        assert submitted.status_code == 200, submitted.text
        result = api.wait(submitted.json()["id"], ("completed", "failed"))
        assert result["status"] == "completed", result
        assert result["info"]["inputs"] == 1
        (url,) = result["outputs"]
        key = url.split("/api/v1/outputs/", 1)[1]
        # Only the output is left: the input went once the task ended.
        assert s3_server.keys(bucket) == [f"tasks/{key}"]
        stored = s3_client_bytes(s3_server, bucket, f"tasks/{key}")
        with httpx.Client(timeout=30) as anonymous:  # the unguessable URL is the credential
            response = anonymous.get(url, headers={"Range": "bytes=2-11"})
            if delivery == "redirect":
                assert response.status_code == 307
                response = anonymous.get(
                    response.headers["location"], headers={"Range": "bytes=2-11"}
                )
            assert response.status_code == 206, response.text
            assert response.content == stored[2:12]
            whole = anonymous.get(url, follow_redirects=True)
            assert whole.status_code == 200 and whole.content == stored
        api.http.close()
    finally:
        stop_service(service)


def s3_client_bytes(server: S3Server, bucket: str, name: str) -> bytes:
    data: bytes = s3_client(server.endpoint_url).get_object(Bucket=bucket, Key=name)["Body"].read()
    return data


@pytest.mark.parametrize("db", DATABASES)
def test_the_bucket_going_away_answers_503_and_loses_no_task(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, partition: Partition
) -> None:
    url = None if db == "sqlite" else request.getfixturevalue("pg_url")
    bucket = partition.new_bucket()
    env = bucket_env(partition.endpoint_url, bucket, GENHOOK_FAULT_RETRY_SECONDS="0.5")
    service = start_service(tmp_path, url, **env)
    try:
        api = Api(service)
        first = api.submit().json()["id"]
        output = api.wait(first, ("completed",))["outputs"][0]
        running = api.submit("sleep=2").json()["id"]
        api.wait(running, ("processing",))
        partition.cut()

        # What needs the bucket answers 503 with Retry-After; what does not still works.
        for response in (api.http.get(output), api.submit()):
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["code"] == 503
        assert api.http.get(f"/api/v1/model/result/{first}").status_code == 200

        # The running task cannot store its output: it is requeued, neither failed nor lost.
        log = ""
        for _ in range(200):
            log = service.log()
            if f"task {running}: storage or database fault" in log:
                break
            time.sleep(0.05)
        assert "requeued" in log, log
        assert api.wait(running, ("created", "processing", "failed"))["status"] != "failed"

        partition.heal()
        result = api.wait(running, ("completed", "failed"))
        assert result["status"] == "completed", result
        assert api.http.get(result["outputs"][0]).status_code == 200
        assert api.http.get(output).status_code == 200
        api.http.close()
    finally:
        stop_service(service)
