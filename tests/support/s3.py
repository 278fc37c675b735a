"""A real S3-protocol server on loopback: moto's standalone server as a subprocess.

The AWS SDK is pointed at it by endpoint URL, with test credentials in the environment and
the instance-metadata lookup switched off, so nothing ever leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.postgres import free_port

# What the SDK reads; every process the tests start inherits it.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "genhook-test",
    "AWS_SECRET_ACCESS_KEY": "genhook-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Server:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        """A plain (blocking) botocore client, for setting up and checking buckets."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=S3_ENV["AWS_DEFAULT_REGION"],
            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        )

    def new_bucket(self) -> str:
        """A fresh, empty bucket for one test."""
        name = "genhook-" + uuid.uuid4().hex[:16]
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))

    def stop(self) -> None:
        """Stop the server and anything it started (its whole process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


def start_s3(port: int | None = None) -> S3Server:
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **S3_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = S3Server(port, process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto.server exited with {process.returncode}")
        try:
            httpx.get(f"{server.endpoint_url}/moto-api/", timeout=1)
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError("moto.server did not start")


@contextlib.contextmanager
def running_s3() -> Iterator[S3Server]:
    """The server, with the SDK's environment set for this process while it runs."""
    saved = {name: os.environ.get(name) for name in S3_ENV}
    os.environ.update(S3_ENV)
    server = start_s3()
    try:
        yield server
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
