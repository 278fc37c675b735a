"""Hostile input against the live service, by class: body shapes, JSON edge cases, connection
behaviours, decode-cost bombs and URL spellings.

Every answer is below 500 with the error shape, nothing hangs (each exchange has a client
timeout), ``/healthz`` answers throughout and the API process stays under 500 MB; on SQLite
and PostgreSQL.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from genhook.net import parse_target
from tests.conftest import LiveService, start_service, stop_service
from tests.support.bombs import many_chunk_png, many_scan_jpeg
from tests.support.hostile import (
    HealthMonitor,
    body_shapes,
    chunks,
    json_edge_cases,
    peak_rss_bytes,
    url_spellings,
)
from tests.support.http import HTTP

MAX_BODY = 16 * 1024 * 1024
MAX_JSON = 256 * 1024
MAX_CONNECTIONS = 64
MAX_SCANS = 100
MAX_CHUNKS = 10_000
ENV = {
    "GENHOOK_WORKERS": "1",
    "GENHOOK_MAX_BODY_BYTES": str(MAX_BODY),
    "GENHOOK_MAX_JSON_BYTES": str(MAX_JSON),
    "GENHOOK_HEADER_TIMEOUT_SECONDS": "1",
    "GENHOOK_BODY_TIMEOUT_SECONDS": "2",
    "GENHOOK_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "GENHOOK_MAX_DECODE_SCANS": str(MAX_SCANS),
    "GENHOOK_MAX_DECODE_CHUNKS": str(MAX_CHUNKS),
}
SHAPES = body_shapes(MAX_BODY, MAX_JSON)
EDGES = json_edge_cases()
URLS = url_spellings()


@dataclass
class Target:
    live: LiveService
    health: HealthMonitor

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.live.api_key}"}

    def post(self, content: bytes, content_type: str = "application/json") -> httpx.Response:
        return HTTP.post(
            f"{self.live.base_url}/api/v1/model/generateImage",
            content=content,
            headers={**self.auth, "Content-Type": content_type},
            timeout=60,
        )

    def submit(self, body: dict[str, Any]) -> httpx.Response:
        return self.post(json.dumps(body).encode())

    def wait(self, task_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            response = HTTP.get(
                f"{self.live.base_url}/api/v1/model/result/{task_id}", headers=self.auth, timeout=30
            )
            assert response.status_code == 200, response.text
            view: dict[str, Any] = response.json()
            if view["status"] in ("completed", "failed", "timeout"):
                return view
            time.sleep(0.1)
        raise AssertionError(f"task {task_id} did not end")


# Refused by the HTTP layer or by validation before any database work: one database is
# enough. Tests that store or read tasks run on both.
HTTP_ONLY = pytest.mark.parametrize("target", ["sqlite"], indirect=True)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    database_url = None
    if request.param == "postgres":
        server = request.getfixturevalue("pg_server")
        name = "t_" + uuid.uuid4().hex[:12]
        server.psql(f"CREATE DATABASE {name}")
        database_url = server.url(name)
    live = start_service(tmp_path_factory.mktemp("hostile"), database_url, **ENV)
    try:
        with HealthMonitor(live.base_url) as health:
            yield Target(live, health)
    finally:
        stop_service(live)


def assert_refused(response: httpx.Response, *statuses: int) -> None:
    assert response.status_code in (statuses or (400, 413)), response.text[:500]
    body = response.json()
    assert body["code"] == response.status_code
    assert isinstance(body["message"], str) and body["message"]
    assert all(set(e) == {"field", "message"} for e in body["errors"])


@HTTP_ONLY
@pytest.mark.parametrize("shape", list(SHAPES))
def test_body_shapes_are_refused_cheaply(target: Target, shape: str) -> None:
    assert_refused(target.post(SHAPES[shape]()))


@HTTP_ONLY
@pytest.mark.parametrize("case", list(EDGES))
def test_json_edge_cases_are_400(target: Target, case: str) -> None:
    assert_refused(target.post(EDGES[case]), 400)


@HTTP_ONLY
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_other_content_types_are_400(target: Target, content_type: str) -> None:
    assert_refused(target.post(b'{"model": "x"}', content_type), 400)


def test_escaped_slashes_in_a_data_url_are_read(target: Target) -> None:
    """JSON encoders may write ``/`` as ``\\/``; the image data is still found and decoded."""
    from tests.support.images import image_bytes

    encoded = base64.b64encode(image_bytes(size=64)).decode().replace("/", "\\/")
    body = (
        '{"model":"genhook/image-edit","prompt":"black and white","size":"1024*1024",'
        '"images":["data:image\\/png;base64,' + encoded + '"]}'
    )
    response = target.post(body.encode())
    assert response.status_code == 200, response.text


@HTTP_ONLY
def test_chunked_upload_is_capped(target: Target) -> None:
    """A body without Content-Length is capped while streaming, not after."""
    payload = b'{"prompt":"' + b"a" * (MAX_BODY + 1024) + b'"}'
    response = HTTP.post(
        f"{target.live.base_url}/api/v1/model/generateImage",
        content=chunks(payload, 65536),
        headers={**target.auth, "Content-Type": "application/json"},
        timeout=60,
    )
    assert_refused(response, 413)


ODD_IDS = ["%00", "a%00b", "%ff", "%c3%28", "%ed%a0%80", "x" * 5000, "%2e%2e%2f%2e%2e", "\\", "%0a"]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_odd_ids_and_queries_are_never_5xx(target: Target, odd: str) -> None:
    """Path and query values reach the database on every read endpoint: an empty page or a
    4xx, never a 500 (PostgreSQL refuses NUL and invalid UTF-8 in text)."""
    base = target.live.base_url
    requests = [
        ("GET", f"/api/v1/model/result/{odd}"),
        ("GET", f"/api/v1/outputs/outputs/{odd}"),
        ("GET", f"/api/v1/webhooks/deliveries?session_id={odd}"),
        ("GET", f"/api/v1/webhooks/deliveries?before={odd}"),
        ("POST", f"/api/v1/webhooks/deliveries/{odd}/redeliver"),
        ("GET", f"/api/v1/usage?cursor={odd}"),
        ("GET", f"/api/v1/usage?limit={odd}"),
        ("GET", "/api/v1/usage?cursor=" + "9" * 5000),
    ]
    for method, path in requests:
        response = httpx.request(method, base + path, headers=target.auth, timeout=30)
        if response.status_code != 200:
            assert_refused(response, 400, 404)


# -- connections ---------------------------------------------------------------------------


def _connect(target: Target) -> socket.socket:
    port = int(target.live.base_url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed_while_trickling(sock: socket.socket, data: bytes, pause: float) -> bytes | None:
    """Send ``data`` a byte at a time; what the server answered once it closed, else None."""
    sock.settimeout(pause)
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return b""
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return b""
        return answer
    return None


@HTTP_ONLY
def test_trickled_headers_are_cut_off(target: Target) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    with _connect(target) as sock:
        answer = _closed_while_trickling(sock, request, 0.1)
    assert answer is not None, "a request trickled over 10 s was served"
    assert b"200 OK" not in answer
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408")


@HTTP_ONLY
def test_a_kept_alive_connection_may_pause_past_the_header_deadline(target: Target) -> None:
    """The idle time between kept-alive requests is the keep-alive timeout's (5 s), not the
    header deadline's (1 s here): a pooled client that pauses is not cut off."""
    port = int(target.live.base_url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for _ in range(2):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            sock = connection.sock
            time.sleep(2.0)
        assert connection.sock is sock, "the second request needed a new connection"
    finally:
        connection.close()


@HTTP_ONLY
def test_trickled_body_is_cut_off(target: Target) -> None:
    head = (
        b"POST /api/v1/model/generateImage HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + target.live.api_key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with _connect(target) as sock:
        sock.sendall(head)
        answer = _closed_while_trickling(sock, b" " * 1000, 0.05)
    assert answer is not None, "a body trickled over 50 s was read to the end"
    assert b"HTTP/1.1 5" not in answer


@HTTP_ONLY
def test_connection_cap_refuses_clearly(target: Target) -> None:
    socks = [_connect(target) for _ in range(MAX_CONNECTIONS + 16)]
    try:
        for sock in socks:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        refused = []
        for sock in socks[MAX_CONNECTIONS - 8 :]:
            sock.settimeout(0.5)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            if answer.startswith(b"HTTP/1.1 503"):
                refused.append(answer)
        assert refused, "no connection past the cap was refused"
        body = json.loads(refused[0].split(b"\r\n\r\n", 1)[1])
        assert body["code"] == 503 and "connections" in body["message"]
    finally:
        for sock in socks:
            sock.close()
    # Past the cap, the service still serves new connections once the flood is gone.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if HTTP.get(target.live.base_url + "/healthz", timeout=10).status_code == 200:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("new connections were not served after the flood")


@HTTP_ONLY
def test_disconnect_mid_body_is_one_info_line(target: Target) -> None:
    head = (
        b"POST /api/v1/model/generateImage HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + target.live.api_key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    )
    for _ in range(3):
        with _connect(target) as sock:
            sock.sendall(head + b'{"model": "' + b"x" * 10_000)
    deadline = time.monotonic() + 10
    while "client disconnected" not in target.live.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = target.live.log()
    assert "client disconnected" in log
    assert "Traceback" not in log and " ERROR " not in log


@HTTP_ONLY
def test_a_pooled_client_survives_early_answers(target: Target) -> None:
    """An answer sent before the body is read (a wrong key here) closes the connection and
    says so, so a pooled client opens a fresh one instead of reusing a half-read one."""
    body = b'{"model": "test/fake-edit", "prompt": "' + b"x" * 900_000 + b'"}'
    headers = {"Authorization": "Bearer wrong", "Content-Type": "application/json"}
    url = f"{target.live.base_url}/api/v1/model/generateImage"
    with httpx.Client(timeout=30) as client:
        answers = []
        for _ in range(6):
            response = client.post(url, content=body, headers=headers)
            answers.append((response.status_code, response.headers.get("connection")))
        assert answers == [(401, "close")] * 6
        # The pool still serves an ordinary request afterwards.
        assert client.get(target.live.base_url + "/healthz").status_code == 200


@HTTP_ONLY
@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/healthz", "GET"),
        ("DELETE", "/api/v1/model/generateImage", "POST"),
        ("GET", "/api/v1/model/generateVideo", "POST"),
        ("POST", "/api/v1/model/result/abc", "GET"),
        ("PATCH", "/api/v1/usage", "GET"),
    ],
)
def test_405_carries_allow(target: Target, method: str, path: str, allowed: str) -> None:
    response = httpx.request(method, target.live.base_url + path, headers=target.auth, timeout=30)
    assert_refused(response, 405)
    assert allowed in response.headers["allow"]


@HTTP_ONLY
@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 5000 + b"\r\n",
        b"POST /api/v1/model/generateImage HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"POST /api/v1/model/generateImage HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nzz\r\n",
        b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_malformed_http_is_never_a_5xx(target: Target, raw: bytes) -> None:
    with _connect(target) as sock:
        sock.sendall(raw)
        answer = sock.recv(65536)
    assert not answer.startswith(b"HTTP/1.1 5"), answer[:200]
    assert b"Traceback" not in answer


# -- images --------------------------------------------------------------------------------


def _image_task(target: Target, data: bytes, mime: str) -> dict[str, Any]:
    response = target.submit(
        {
            "model": "genhook/image-edit",
            "prompt": "black and white",
            "size": "1024*1024",
            "images": [f"data:{mime};base64," + base64.b64encode(data).decode()],
        }
    )
    assert response.status_code == 200, response.text
    return target.wait(response.json()["id"])


@HTTP_ONLY
@pytest.mark.parametrize("scans", [MAX_SCANS + 1, 4 * MAX_SCANS, 4000])
def test_jpeg_scan_bombs_are_refused(target: Target, scans: int) -> None:
    view = _image_task(target, many_scan_jpeg(scans, size=512), "image/jpeg")
    assert view["status"] == "failed"
    assert view["error_code"] == 1007, view
    assert f"{scans} scans" in view["error"]


@HTTP_ONLY
@pytest.mark.parametrize("count", [MAX_CHUNKS + 1, 5 * MAX_CHUNKS])
def test_png_chunk_bombs_are_refused(target: Target, count: int) -> None:
    view = _image_task(target, many_chunk_png(count), "image/png")
    assert view["status"] == "failed"
    assert view["error_code"] == 1007, view


def test_inputs_under_the_decode_limits_are_decoded(target: Target) -> None:
    for data, mime in (
        (many_scan_jpeg(MAX_SCANS // 2, size=256), "image/jpeg"),
        (many_chunk_png(MAX_CHUNKS // 2), "image/png"),
    ):
        view = _image_task(target, data, mime)
        assert view.get("error_code") != 1007, view


# -- URLs ----------------------------------------------------------------------------------


def test_url_spellings_accepted_at_submit_are_usable(target: Target) -> None:
    """Each spelling as an image URL and as a webhook URL: refused at submit with a 400 that
    names the field, or accepted and then parsed the same way by the worker and dispatcher;
    an accepted image URL ends as a fetch failure, never an engine error."""
    accepted: list[str] = []
    for url in URLS:
        for field in ("images", "webhook_url"):
            body: dict[str, Any] = {
                "model": "genhook/image-edit",
                "prompt": "black and white",
                "size": "1024*1024",
                "images": [url] if field == "images" else ["http://127.0.0.1:9/a.png"],
            }
            if field == "webhook_url":
                body["webhook_url"] = url
            response = target.submit(body)
            if response.status_code == 200:
                parse_target(url, max_length=8192)
                if field == "images":
                    accepted.append(response.json()["id"])
                continue
            assert_refused(response, 400)
            named = [e["field"] for e in response.json()["errors"]]
            # A NUL is refused for the whole body, wherever it is.
            expected = "body" if "\x00" in url else field
            assert any(name.startswith(expected) for name in named), (url, response.text)
    assert accepted, "no spelling was accepted; the generator lost its plain URLs"
    for task_id in accepted:
        view = target.wait(task_id)
        assert view["error_code"] in (1001, 1003), view


# -- throughout ----------------------------------------------------------------------------


def test_zz_health_answered_and_memory_bounded(target: Target) -> None:
    deadline = time.monotonic() + 10
    while not target.health.latencies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.health.latencies, "the health monitor never ran"
    assert target.health.failures == []
    assert peak_rss_bytes(target.live.process.pid) < 500 * 1024 * 1024
    assert "Traceback" not in target.live.log()
    print(
        f"healthz during the hostile suite: {len(target.health.latencies)} probes, "
        f"p50 {target.health.percentile(0.5) * 1000:.1f} ms, "
        f"p99 {target.health.percentile(0.99) * 1000:.1f} ms"
    )
