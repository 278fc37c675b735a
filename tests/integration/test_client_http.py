"""The API client against a scripted HTTP server on 127.0.0.1: bodies, errors, retries, wait."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from genhook.client import (
    APIConnectionError,
    AsyncClient,
    Client,
    GenhookError,
    InvalidRequest,
    ModelInfo,
    NotFound,
    PayloadTooLarge,
    Prediction,
    TaskFailed,
    TooManyRequests,
    Unauthorized,
    WaitTimeout,
    lora,
)
from genhook.errors import ServiceUnavailable

PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FakeApi:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.seen: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append(
                    Seen(
                        self.command,
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
                reply = (
                    outer.replies.popleft()
                    if outer.replies
                    else Reply(500, {"message": "no reply"})
                )
                if reply.delay:
                    time.sleep(reply.delay)
                payload = (
                    reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                )
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass

            do_GET = do_POST = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def reply(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prediction(status: str = "created", **extra: Any) -> dict[str, Any]:
    return {
        "id": "task_1",
        "model": "genhook/image-edit",
        "status": status,
        "outputs": [],
        "has_nsfw_contents": [],
        "created_at": "2026-11-22T08:00:00Z",
        "urls": {"get": "http://127.0.0.1/api/v1/model/result/task_1"},
        **extra,
    }


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeApi()
    yield server
    server.close()


@pytest.fixture
def client(api: FakeApi) -> Iterator[Client]:
    with Client("ghk_test", base_url=api.base_url, retry_backoff=0.01, retry_backoff_cap=0.02) as c:
        yield c


def test_edit_turns_paths_bytes_pil_and_urls_into_items(api, client, tmp_path: Path):
    path = tmp_path / "photo.bin"  # the extension is not trusted; the bytes are
    path.write_bytes(PNG_1PX)
    pil = Image.new("RGB", (3, 2), (255, 0, 0))
    jpeg = io.BytesIO()
    pil.save(jpeg, format="JPEG")
    api.reply(Reply(body=prediction()))
    result = client.edit(
        "make it blue",
        [
            path,
            str(path),
            jpeg.getvalue(),
            pil,
            "https://example.test/a.png",
            "data:image/png;base64,AAAA",
        ],
        size="1024*1024",
        webhook_url="https://hooks.example.test/genhook",
    )
    assert isinstance(result, Prediction) and result.id == "task_1" and result.status == "created"
    assert result.urls["get"].endswith("/task_1")
    seen = api.seen[0]
    assert (seen.method, seen.path) == ("POST", "/api/v1/model/generateImage")
    assert seen.headers["authorization"] == "Bearer ghk_test"
    body = seen.json()
    assert body["model"] == "genhook/image-edit" and body["prompt"] == "make it blue"
    assert (
        body["size"] == "1024*1024" and body["webhook_url"] == "https://hooks.example.test/genhook"
    )
    # Unset options are omitted so the service's defaults apply.
    assert "output_format" not in body and "thinking" not in body
    images = body["images"]
    png_url = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    assert images[0] == images[1] == png_url
    assert images[2].startswith("data:image/jpeg;base64,")
    assert base64.b64decode(images[2].split(",", 1)[1]) == jpeg.getvalue()
    decoded = Image.open(io.BytesIO(base64.b64decode(images[3].split(",", 1)[1])))
    assert images[3].startswith("data:image/png;base64,") and decoded.size == (3, 2)
    assert decoded.getpixel((0, 0)) == (255, 0, 0)
    assert images[4:] == ["https://example.test/a.png", "data:image/png;base64,AAAA"]


def test_edit_accepts_a_single_image_and_missing_files_fail_early(api, client, tmp_path):
    api.reply(Reply(body=prediction()))
    client.edit("x", PNG_1PX)
    assert len(api.seen[0].json()["images"]) == 1
    with pytest.raises(FileNotFoundError):
        client.edit("x", [tmp_path / "missing.png"])
    assert len(api.seen) == 1


def test_submit_other_kinds_and_fields(api, client):
    api.reply(Reply(body=prediction()))
    client.submit("acme/video", kind="video", prompt="waves", duration=5)
    seen = api.seen[0]
    assert seen.path == "/api/v1/model/generateVideo"
    assert seen.json() == {"model": "acme/video", "prompt": "waves", "duration": 5}


def test_submit_reads_local_files_for_every_media_field(api, client, tmp_path):
    audio = tmp_path / "speech.mp3"
    audio.write_bytes(b"ID3\x04fake mp3 bytes")
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    image = tmp_path / "photo.png"
    image.write_bytes(PNG_1PX)
    api.reply(Reply(body=prediction()), Reply(body=prediction()), Reply(body=prediction()))
    client.submit("genhook/speech-to-text", kind="audio", audio=audio)
    client.submit("genhook/speech-to-text", kind="audio", audio=str(audio), language="en")
    client.submit(
        "acme/video-edit",
        kind="video",
        prompt="sepia",
        video=video,
        images=image,
        style_image="https://example.test/look.png",
    )
    expected_audio = "data:audio/mpeg;base64," + base64.b64encode(audio.read_bytes()).decode()
    assert api.seen[0].json() == {"model": "genhook/speech-to-text", "audio": expected_audio}
    assert api.seen[1].json()["audio"] == expected_audio
    assert api.seen[1].json()["language"] == "en"  # other fields are left alone
    body = api.seen[2].json()
    assert body["video"] == "data:video/mp4;base64," + base64.b64encode(video.read_bytes()).decode()
    assert body["images"] == ["data:image/png;base64," + base64.b64encode(PNG_1PX).decode()]
    assert body["style_image"] == "https://example.test/look.png" and body["prompt"] == "sepia"
    # A Path that names no file fails before anything is sent.
    with pytest.raises(FileNotFoundError):
        client.submit("genhook/speech-to-text", kind="audio", audio=tmp_path / "missing.mp3")
    assert len(api.seen) == 3


async def test_async_submit_reads_local_files(api, tmp_path):
    audio = tmp_path / "speech.wav"
    audio.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt ")
    api.reply(Reply(body=prediction()))
    async with AsyncClient("ghk_a", base_url=api.base_url) as c:
        await c.submit("genhook/speech-to-text", kind="audio", audio=audio)
    assert api.seen[0].json()["audio"].startswith("data:audio/")


def test_client_finds_the_local_services_key_and_says_how_to_pass_one(api, monkeypatch, tmp_path):
    monkeypatch.delenv("GENHOOK_API_KEY", raising=False)
    monkeypatch.delenv("GENHOOK_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    # No key anywhere: the service's 401 comes back with how to pass one.
    api.reply(Reply(401, {"code": 401, "message": "missing Authorization header"}))
    with Client(base_url=api.base_url, max_retries=0) as c, pytest.raises(Unauthorized) as exc:
        c.result("task_1")
    assert "authorization" not in api.seen[0].headers
    assert "missing Authorization header" in exc.value.message
    assert "GENHOOK_API_KEY" in exc.value.message and "api_key=" in exc.value.message
    # Next to `genhook serve`: ./genhook-data/credentials.json, as the CLI reads it.
    (tmp_path / "genhook-data").mkdir()
    (tmp_path / "genhook-data" / "credentials.json").write_text(
        json.dumps({"api_key": "ghk_local", "account_id": "acc_1"})
    )
    api.reply(Reply(body=prediction()))
    with Client(base_url=api.base_url) as c:
        c.result("task_1")
    assert api.seen[1].headers["authorization"] == "Bearer ghk_local"
    # Or wherever GENHOOK_DATA_DIR says, from any directory.
    data_dir = tmp_path / "elsewhere"
    data_dir.mkdir()
    (data_dir / "credentials.json").write_text(json.dumps({"api_key": "ghk_data_dir"}))
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(data_dir))
    api.reply(Reply(body=prediction()))
    with Client(base_url=api.base_url) as c:
        c.result("task_1")
    assert api.seen[2].headers["authorization"] == "Bearer ghk_data_dir"
    # Never sent to a service on another machine; an explicit key always wins.
    assert Client(base_url="https://api.example.test").api_key is None
    assert Client("ghk_given", base_url=api.base_url).api_key == "ghk_given"


def test_submit_loras_as_name_scale_strings(api, client):
    api.reply(Reply(body=prediction()))
    extra = {"name": "ink", "scale": -0.5}
    client.submit("local/sdxl", prompt="x", loras=["film:0.8", "noir", extra])
    assert api.seen[0].json()["loras"] == [
        {"name": "film", "scale": 0.8},
        {"name": "noir"},
        {"name": "ink", "scale": -0.5},
    ]
    assert lora("https://cdn.example/a.safetensors") == {"url": "https://cdn.example/a.safetensors"}
    with pytest.raises(ValueError, match="must be a number"):
        lora("film:strong")
    info = ModelInfo.from_json(
        {"id": "local/sdxl", "choices": {"loras": [{"name": "film", "scale": 1.0}]}}
    )
    assert info.loras == [{"name": "film", "scale": 1.0}]
    assert ModelInfo.from_json({"id": "genhook/image-edit"}).loras == []


def test_400_maps_to_invalid_request_with_field_errors(api, client):
    api.reply(
        Reply(
            400,
            {
                "code": 400,
                "message": "the request is invalid",
                "errors": [{"field": "images[3]", "message": "not an accepted image format"}],
            },
        )
    )
    with pytest.raises(InvalidRequest) as exc:
        client.edit("x", "https://example.test/a.png")
    err = exc.value
    assert err.status_code == 400 and err.message == "the request is invalid"
    assert [(e.field, e.message) for e in err.errors] == [
        ("images[3]", "not an accepted image format")
    ]
    assert len(api.seen) == 1  # a 400 is never retried


@pytest.mark.parametrize(
    ("status", "cls"),
    [(401, Unauthorized), (404, NotFound), (413, PayloadTooLarge)],
)
def test_status_mapping(api, client, status, cls):
    api.reply(Reply(status, {"code": status, "message": f"m{status}", "errors": []}))
    with pytest.raises(cls) as exc:
        client.result("task_1")
    assert exc.value.status_code == status and exc.value.message.startswith(f"m{status}")
    assert len(api.seen) == 1


def test_429_is_retried_then_raised(api):
    api.reply(*[Reply(429, {"code": 429, "message": "slow down"}, {"Retry-After": "0"})] * 3)
    with (
        Client("k", base_url=api.base_url, max_retries=2) as c,
        pytest.raises(TooManyRequests) as exc,
    ):
        c.edit("x", "https://example.test/a.png")
    assert exc.value.message == "slow down" and len(api.seen) == 3


def test_429_then_success_on_submit(api, client):
    api.reply(
        Reply(429, {"code": 429, "message": "busy"}, {"Retry-After": "0"}), Reply(body=prediction())
    )
    assert client.edit("x", "https://example.test/a.png").id == "task_1"
    assert len(api.seen) == 2


def test_reads_retry_5xx_but_submits_do_not(api, client):
    api.reply(
        Reply(503, {"message": "later"}),
        Reply(502, b"<html>bad gateway</html>"),
        Reply(body=prediction("processing")),
    )
    assert client.result("task_1").status == "processing"
    assert [s.path for s in api.seen] == ["/api/v1/model/result/task_1"] * 3
    api.seen.clear()
    api.reply(Reply(503, {"code": 503, "message": "later"}))
    with pytest.raises(ServiceUnavailable):
        client.edit("x", "https://example.test/a.png")
    assert len(api.seen) == 1


def test_non_json_error_body_keeps_the_status(api, client):
    api.reply(*[Reply(502, b"<html>bad gateway</html>")] * 4)
    with pytest.raises(GenhookError) as exc:
        client.result("task_1")
    assert exc.value.status_code == 502 and "bad gateway" in exc.value.message


def test_read_timeout_is_retried_for_reads_only(api):
    with Client("k", base_url=api.base_url, timeout=0.2, retry_backoff=0.01) as c:
        api.reply(Reply(body=prediction(), delay=1.0), Reply(body=prediction("completed")))
        assert c.result("task_1").status == "completed"
        assert len(api.seen) == 2
        api.seen.clear()
        api.reply(Reply(body=prediction(), delay=1.0))
        with pytest.raises(APIConnectionError):
            c.edit("x", "https://example.test/a.png")
        assert len(api.seen) == 1


def test_connection_refused_raises_after_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Client("k", base_url=f"http://127.0.0.1:{port}", retry_backoff=0.01) as c:
        with pytest.raises(APIConnectionError):
            c.edit("x", "https://example.test/a.png")
        with pytest.raises(APIConnectionError):
            c.result("task_1")


def test_task_id_is_escaped_in_the_path(api, client):
    api.reply(Reply(404, {"code": 404, "message": "no such task"}))
    with pytest.raises(NotFound):
        client.result("../usage")
    assert api.seen[0].path == "/api/v1/model/result/..%2Fusage"


def test_wait_polls_until_terminal_and_reports_each_poll(api, client):
    api.reply(
        Reply(body=prediction("created")),
        Reply(body=prediction("processing")),
        Reply(
            body=prediction(
                "completed", outputs=["http://o/1"], has_nsfw_contents=[False], info={"op": "blur"}
            )
        ),
    )
    seen: list[str] = []
    done = client.wait("task_1", poll_interval=0.01, on_update=lambda p: seen.append(p.status))
    assert seen == ["created", "processing", "completed"]
    assert done.succeeded and done.outputs == ["http://o/1"] and done.info == {"op": "blur"}
    assert done.raise_for_failure() is done


def test_wait_returns_failed_tasks_and_raise_for_failure(api, client):
    api.reply(Reply(body=prediction("failed", error="prompt not understood", error_code=3001)))
    failed = client.wait("task_1", poll_interval=0.01)
    assert failed.done and not failed.succeeded and failed.error_code == 3001
    with pytest.raises(TaskFailed, match="3001") as exc:
        failed.raise_for_failure()
    assert exc.value.prediction is failed


def test_wait_timeout_carries_the_last_poll(api, client):
    api.reply(*[Reply(body=prediction("processing"))] * 200)
    with pytest.raises(WaitTimeout) as exc:
        client.wait("task_1", timeout=0.2, poll_interval=0.02, max_poll_interval=0.05)
    assert exc.value.last.status == "processing"


def test_usage_is_typed_with_decimal_money(api, client):
    api.reply(
        Reply(
            body={
                "account_id": "acc_1",
                "currency": "USD",
                "total_usd": "0.033",
                "task_count": 1,
                "items": [
                    {
                        "task_id": "task_1",
                        "model": "genhook/image-edit",
                        "tier": "1.5K",
                        "output_pixels": 1048576,
                        "input_images": 2,
                        "lines": [["1.5K output", "0.030"], ["extra input image", "0.003"]],
                        "amount_usd": "0.033",
                        "created_at": "2026-11-22T08:00:00Z",
                    }
                ],
                "next_cursor": 7,
            }
        )
    )
    usage = client.usage(limit=1)
    assert api.seen[0].path == "/api/v1/usage?limit=1"
    assert usage.total_usd == Decimal("0.033") and usage.next_cursor == 7
    assert usage.items[0].lines[1] == ("extra input image", Decimal("0.003"))


def test_jwks_needs_no_key(api, client):
    api.reply(Reply(body={"keys": []}))
    assert client.jwks() == {"keys": []}
    assert "authorization" not in api.seen[0].headers


def test_environment_supplies_key_and_base_url(api, monkeypatch):
    monkeypatch.setenv("GENHOOK_API_KEY", "ghk_from_env")
    monkeypatch.setenv("GENHOOK_BASE_URL", api.base_url + "/")
    api.reply(Reply(body=prediction()))
    with Client() as c:
        c.result("task_1")
    assert api.seen[0].headers["authorization"] == "Bearer ghk_from_env"


async def test_async_client_same_contract(api, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(PNG_1PX)
    async with AsyncClient("ghk_a", base_url=api.base_url, retry_backoff=0.01) as c:
        api.reply(Reply(body=prediction()))
        created = await c.edit("x", path, output_format="png")
        assert created.id == "task_1"
        body = api.seen[0].json()
        assert body["output_format"] == "png" and body["images"][0].startswith("data:image/png")
        api.reply(
            Reply(503, {}),
            Reply(body=prediction("processing")),
            Reply(body=prediction("completed")),
        )
        polls: list[str] = []
        done = await c.wait(
            "task_1", poll_interval=0.01, on_update=lambda p: polls.append(p.status)
        )
        assert done.succeeded and polls == ["processing", "completed"]
        api.reply(
            Reply(
                400, {"code": 400, "message": "bad", "errors": [{"field": "size", "message": "no"}]}
            )
        )
        with pytest.raises(InvalidRequest) as exc:
            await c.submit("genhook/image-edit", prompt="x", images=[], size="1*1")
        assert exc.value.errors[0].field == "size"


# The client commands of the ``genhook`` CLI, on the same scripted server.


def cli(api: FakeApi, *args: str) -> Any:
    from typer.testing import CliRunner

    from genhook.cli import app

    env = {"GENHOOK_BASE_URL": api.base_url, "GENHOOK_API_KEY": "ghk_cli", "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def test_cli_submit_sends_files_and_fields(api, tmp_path):
    path = tmp_path / "in.png"
    path.write_bytes(PNG_1PX)
    api.reply(Reply(body=prediction()))
    out = cli(
        api,
        "submit",
        "--kind",  # no catalogue look-up: the fake answers only what is scripted
        "image",
        "-p",
        "blur it",
        "-i",
        str(path),
        "-i",
        "https://example.test/b.png",
        "--size",
        "1024*1024",
        "-f",
        "thinking=disabled",
        "-f",
        "enable_base64_output=true",
    )
    assert out.exit_code == 0, out.output
    assert "task_1" in out.output and "created" in out.output
    body = api.seen[0].json()
    assert api.seen[0].headers["authorization"] == "Bearer ghk_cli"
    assert body["images"][0].startswith("data:image/png;base64,")
    assert body["images"][1] == "https://example.test/b.png"
    assert body["thinking"] == "disabled" and body["enable_base64_output"] is True


def test_cli_submit_loras(api):
    api.reply(Reply(body=prediction()))
    out = cli(
        api,
        "submit",
        "--kind",
        "image",
        "-m",
        "local/sdxl",
        "-p",
        "a cat",
        "--lora",
        "film:0.8",
        "--lora",
        "noir",
    )
    assert out.exit_code == 0, out.output
    assert api.seen[0].json()["loras"] == [{"name": "film", "scale": 0.8}, {"name": "noir"}]
    out = cli(api, "submit", "--kind", "image", "-p", "a cat", "--lora", "film:lots")
    assert out.exit_code == 2 and "--lora" in out.output and len(api.seen) == 1


def test_cli_submit_priority(api):
    api.reply(Reply(body=prediction(priority="high")), Reply(body=prediction()))
    out = cli(api, "submit", "--kind", "image", "-p", "a cat", "--priority", "high", "--json")
    assert out.exit_code == 0, out.output
    assert api.seen[0].json()["priority"] == "high"
    assert json.loads(out.output)["priority"] == "high"
    out = cli(api, "submit", "--kind", "image", "-p", "a cat")
    assert out.exit_code == 0, out.output
    assert "priority" not in api.seen[1].json()  # the service's default applies
    out = cli(api, "submit", "--kind", "image", "-p", "a cat", "--priority", "urgent")
    assert out.exit_code == 2 and "--priority" in out.output and len(api.seen) == 2


def test_cli_submit_wait_exit_codes(api):
    api.reply(
        Reply(body=prediction()),
        Reply(body=prediction("processing")),
        Reply(body=prediction("completed", outputs=["http://o/1.jpeg"])),
    )
    out = cli(
        api, "submit", "--kind", "image", "-p", "x", "-i", "https://example.test/a.png", "--wait"
    )
    assert out.exit_code == 0, out.output
    assert "completed" in out.output and "http://o/1.jpeg" in out.output
    api.reply(Reply(body=prediction("failed", error="no operation", error_code=3001)))
    out = cli(api, "wait", "task_1")
    assert out.exit_code == 1 and "3001" in out.output


def test_cli_errors_show_message_and_fields(api):
    api.reply(
        Reply(
            400,
            {
                "code": 400,
                "message": "the request is invalid",
                "errors": [{"field": "images[0]", "message": "not an image"}],
            },
        )
    )
    out = cli(api, "submit", "-p", "x", "-i", "https://example.test/a.png")
    assert out.exit_code == 3
    assert "the request is invalid" in out.output and "images[0]" in out.output
    api.reply(Reply(404, {"code": 404, "message": "no such task"}))
    out = cli(api, "result", "nope", "--json")
    assert out.exit_code == 3 and "no such task" in out.output


def test_cli_result_json(api):
    api.reply(Reply(body=prediction("completed", outputs=["http://o/1"])))
    out = cli(api, "result", "task_1", "--json")
    assert out.exit_code == 0 and json.loads(out.output)["outputs"] == ["http://o/1"]


def test_cli_prints_a_transcript_and_its_segments_with_verbose(api):
    stt = {
        "text": " We will meet at the library on Monday morning.",
        "language": "en",
        "language_probability": 0.98,
        "duration": 3.1,
        "segments": [
            {"start": 0.0, "end": 1.4, "text": " We will meet at the library"},
            {"start": 1.4, "end": 3.1, "text": " on Monday morning."},
        ],
        "words": [],
    }
    done = prediction("completed", model="genhook/speech-to-text", stt_result=stt)
    api.reply(Reply(body=done))
    out = cli(api, "result", "task_1")
    assert out.exit_code == 0, out.output
    assert "transcript  We will meet at the library on Monday morning." in out.output
    assert "en (0.98)" in out.output and "segment" not in out.output
    api.reply(Reply(body=prediction()), Reply(body=done))
    out = cli(
        api,
        "submit",
        "-m",
        "genhook/speech-to-text",
        "--kind",
        "audio",
        "--audio",
        "https://example.test/a.mp3",
        "--wait",
        "-v",
    )
    assert out.exit_code == 0, out.output
    assert "We will meet at the library on Monday morning." in out.output
    assert "   0.00 →    1.40  We will meet at the library" in out.output
    assert "   1.40 →    3.10  on Monday morning." in out.output


def test_cli_models_shows_choices_bounds_and_defaults_not_inert_fields(api):
    from genhook.api.routes_models import model_info
    from genhook.config import Settings
    from genhook.engines.local._spec import LocalEditRequest
    from genhook.engines.registry import build_registry

    settings = Settings()
    registry = build_registry(settings)
    tts = model_info(registry.get("genhook/text-to-speech"), settings)
    api.reply(Reply(body=tts))
    out = cli(api, "models", "genhook/text-to-speech")
    assert out.exit_code == 0, out.output
    voices = tts["choices"]["voices"]
    assert len(voices) > 100
    # Every voice a user may send is named, with its language; the bounds and defaults too.
    assert f"voices ({len(voices)}): joe (piper, en-us), " in out.output
    assert all(f"{v['voice']} (" in out.output for v in voices)
    assert "0.5..2.0" in out.output and '"joe"' in out.output and "mp3 | wav" in out.output

    edit = model_info(registry.get("genhook/image-edit"), settings)
    api.reply(Reply(body=edit))
    out = cli(api, "models", "genhook/image-edit")
    assert out.exit_code == 0, out.output
    styles = edit["choices"]["styles"]
    assert f"styles ({len(styles)}): " + ", ".join(styles) in out.output
    assert "1..20000 chars" in out.output and "1..10 items" in out.output
    # The built-in engine reads its modes: shown, with what they do.
    assert "thinking" in out.output and "How loosely the prompt is read" in out.output
    assert "no effect" not in out.output

    # A model that takes the edit request but ignores the engine's modes says so, apart.
    local = {**edit, "id": "acme/kontext", "choices": None}
    local["request_schema"] = LocalEditRequest.model_json_schema()
    api.reply(Reply(body=local))
    out = cli(api, "models", "acme/kontext")
    assert out.exit_code == 0, out.output
    assert "accepted, no effect on this model: thinking, prompt_optimization_mode" in out.output
    table = out.output.split("accepted, no effect")[0]
    assert "thinking" not in table and "num_inference_steps" in table and "1..500" in table
