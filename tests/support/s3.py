"""A real S3-protocol server on loopback: moto's standalone server as a subprocess.

The AWS SDK is pointed at it by endpoint URL, with test credentials in the environment and
the instance-metadata lookup switched off, so nothing ever leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.http import HTTP
from tests.support.postgres import free_port

# What the SDK reads; every process the tests start inherits it.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "genhook-test",
    "AWS_SECRET_ACCESS_KEY": "genhook-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def s3_client(endpoint_url: str) -> Any:
    """A plain (blocking) botocore client, for setting up and checking buckets."""
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=S3_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
    )


class Buckets:
    endpoint_url: str

    def new_bucket(self) -> str:
        """A fresh, empty bucket for one test."""
        name = "genhook-" + uuid.uuid4().hex[:16]
        s3_client(self.endpoint_url).create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        listing = s3_client(self.endpoint_url).list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))


@dataclass
class S3Server(Buckets):
    port: int
    process: subprocess.Popen[bytes]

    def __post_init__(self) -> None:
        self.endpoint_url = f"http://127.0.0.1:{self.port}"

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
            HTTP.get(f"{server.endpoint_url}/moto-api/", timeout=1)
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


class Partition(Buckets):
    """A TCP relay in front of the S3 server, on its own loopback port, that can cut the
    network: ``cut()`` drops every open connection and refuses new ones, ``heal()`` listens
    again on the same port. The server behind keeps its objects, as in a real outage."""

    def __init__(self, target: S3Server) -> None:
        self.target = target
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.heal()

    def heal(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._open = self._open, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target.port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
