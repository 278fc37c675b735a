"""The compose stack of deploy/compose.yaml, run for real with podman (scripts/deploy-test.sh).

One pod holds PostgreSQL, the S3 store, the migration, one api, two workers and one
dispatcher, with the environment compose.yaml gives them (host names become 127.0.0.1:
a pod shares one network namespace). Then: an edit is submitted and its signed webhook
received on the host; a worker is killed in the middle of a task and the task runs again on
the other; workers are scaled up to four and back down to two, gracefully.

Usage: python deploy/test/stack.py IMAGE POSTGRES_IMAGE S3_IMAGE POD_NAME
Every container lives in the pod; the caller removes the pod (and this removes them all).
"""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from PIL import Image

from genhook.client import WebhookVerifier

ROOT = Path(__file__).resolve().parents[2]
PODMAN = os.environ.get("PODMAN", "podman").split()
SLIRP_HOST = "10.0.2.2"  # the host's loopback, seen from a slirp4netns pod


def log(message: str) -> None:
    print(f"[stack {time.strftime('%H:%M:%S')}] {message}", flush=True)


def podman(*args: str, check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compose_env(api_port: int) -> dict[str, str]:
    """The x-genhook environment of compose.yaml, its defaults filled in, its host names
    pointed at the pod's loopback."""
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    env: dict[str, str] = {}
    given = {
        "GENHOOK_WEBHOOK_ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32))
        .decode()
        .rstrip("="),
        "GENHOOK_PUBLIC_BASE_URL": f"http://127.0.0.1:{api_port}",
    }
    for name, value in compose["x-genhook"]["environment"].items():
        text = str(value)
        if text.startswith("${") and text.endswith("}"):
            var, _, default = text[2:-1].partition(":")
            text = given.get(var, default.removeprefix("-"))
        else:
            for var in ("POSTGRES_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
                text = text.replace("${%s:-" % var, "\0")  # noqa: UP031
            while "\0" in text:  # ${VAR:-default} inside a longer value: its default
                head, _, tail = text.partition("\0")
                default, _, rest = tail.partition("}")
                text = head + default + rest
        env[name] = text.replace("@postgres:", "@127.0.0.1:").replace("//s3:", "//127.0.0.1:")
    # The receiver is this host: a private address, reached through the pod's gateway.
    env["GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS"] = "true"
    env["GENHOOK_LOG_LEVEL"] = "INFO"
    return env


class Receiver:
    """An HTTP receiver on the host's loopback that keeps every webhook it gets."""

    def __init__(self) -> None:
        self.got: queue.Queue[tuple[dict[str, str], bytes]] = queue.Queue()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.got.put(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stack:
    def __init__(self, image: str, pg_image: str, s3_image: str, pod: str) -> None:
        self.image, self.pg_image, self.s3_image, self.pod = image, pg_image, s3_image, pod
        self.api_port = free_port()
        self.env = compose_env(self.api_port)
        self.base = f"http://127.0.0.1:{self.api_port}"
        self.http = httpx.Client(timeout=30)
        self.receiver = Receiver()
        self.api_key = ""
        self.health_ports: dict[str, int] = {}
        self.verifier = WebhookVerifier(jwks_url=f"{self.base}/api/v1/webhooks/jwks.json")
        self.verified: list[dict[str, Any]] = []

    def env_args(self, **extra: str) -> list[str]:
        out: list[str] = []
        for name, value in {**self.env, **extra}.items():
            out += ["-e", f"{name}={value}"]
        return out

    def run(self, name: str, *command: str, health_port: int | None = None) -> None:
        extra = {} if health_port is None else {"GENHOOK_HEALTH_PORT": str(health_port)}
        if health_port is not None:
            self.health_ports[name] = health_port
        podman(
            "run",
            "-d",
            "--pod",
            self.pod,
            "--name",
            f"{self.pod}-{name}",
            "--hostname",
            name,
            # No timer for the HEALTHCHECK (podman's needs systemd): wait_healthy runs it.
            "--health-interval",
            "disable",
            *self.env_args(**extra),
            self.image,
            *command,
        )

    def up(self) -> None:
        log(f"pod {self.pod}: api on 127.0.0.1:{self.api_port}")
        podman(
            "pod",
            "create",
            "--name",
            self.pod,
            "--share",
            "net",
            "--network",
            "slirp4netns:allow_host_loopback=true",
            "-p",
            f"127.0.0.1:{self.api_port}:8000",
        )
        podman("run", "-d", "--pod", self.pod, "--name", f"{self.pod}-postgres", self.pg_image)
        podman("run", "-d", "--pod", self.pod, "--name", f"{self.pod}-s3", self.s3_image)
        self.wait(
            lambda: (
                podman("exec", f"{self.pod}-postgres", "pg_isready", "-h", "127.0.0.1", check=False)
                and self._ok(f"{self.pod}-postgres", "pg_isready", "-h", "127.0.0.1")
            ),
            "PostgreSQL",
            120,
        )
        make_bucket = (
            "import urllib.request as u; u.urlopen(u.Request("
            "'http://127.0.0.1:9000/genhook', method='PUT'), timeout=5)"
        )
        self.wait(
            lambda: self._ok(f"{self.pod}-s3", "/opt/s3/bin/python", "-c", make_bucket),
            "the S3 store and its bucket",
            120,
        )
        log("migrating (genhook db upgrade)")
        once = ["run", "--rm", "--health-interval", "disable", "--pod", self.pod]
        podman(*once, *self.env_args(), self.image, "db", "upgrade")
        account = json.loads(
            podman(
                *once,
                *self.env_args(),
                self.image,
                "accounts",
                "create",
                "deploy-test",
                "--json",
            )
        )
        self.api_key = account["api_key"]
        self.run("api", "api")
        self.run("dispatcher", "dispatcher", health_port=8100)
        for n in (1, 2):
            self.run(f"worker-{n}", "worker", health_port=8100 + n)
        self.wait(lambda: self.http.get(f"{self.base}/readyz").status_code == 200, "api ready", 120)
        for name in ["api", "dispatcher", "worker-1", "worker-2"]:
            self.wait_healthy(name)

    def _ok(self, container: str, *command: str) -> bool:
        done = subprocess.run(
            [*PODMAN, "exec", container, *command], capture_output=True, timeout=30, check=False
        )
        return done.returncode == 0

    def wait_healthy(self, name: str, timeout: float = 180) -> None:
        """The image's HEALTHCHECK (its /readyz) passes in the container."""
        container = f"{self.pod}-{name}"
        self.wait(
            lambda: (
                subprocess.run(
                    [*PODMAN, "healthcheck", "run", container],
                    capture_output=True,
                    timeout=30,
                    check=False,
                ).returncode
                == 0
            ),
            f"{name} healthy",
            timeout,
        )
        log(f"{name}: healthy")

    @staticmethod
    def wait(ready: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except Exception as error:  # not up yet: keep trying until the deadline
                last = error
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what} ({last!r})")

    def submit(self, path: str, body: dict[str, Any]) -> str:
        body = {**body, "webhook_url": f"http://{SLIRP_HOST}:{self.receiver.port}/hook"}
        answer = self.http.post(
            f"{self.base}/api/v1/model/{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        assert answer.status_code in (200, 201, 202), answer.text
        data = answer.json()
        return str(data.get("data", data)["id"])

    def result(self, task_id: str) -> dict[str, Any]:
        answer = self.http.get(
            f"{self.base}/api/v1/model/result/{task_id}",
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        answer.raise_for_status()
        data: dict[str, Any] = answer.json()
        return data.get("data", data)  # type: ignore[no-any-return]

    def webhook(self, task_id: str, timeout: float = 240) -> dict[str, Any]:
        """The verified webhook of ``task_id`` (kept, whichever task's arrives first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for payload in self.verified:
                if task_id in json.dumps(payload):
                    return payload
            try:
                headers, body = self.receiver.got.get(timeout=1)
            except queue.Empty:
                continue
            event = self.verifier.verify(headers, body)  # raises unless the signature is valid
            log(f"webhook verified: {event.event_type} of {event.session_id}")
            self.verified.append(json.loads(body))
        raise RuntimeError(f"no webhook for {task_id} within {timeout} s")

    def sql(self, query: str) -> str:
        return podman(
            "exec",
            f"{self.pod}-postgres",
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "genhook",
            "-d",
            "genhook",
            "-tAc",
            query,
        ).strip()

    def close(self) -> None:
        self.receiver.close()
        self.http.close()


def image_data_url(size: int = 512) -> str:
    picture = Image.new("RGB", (size, size), (90, 140, 200))
    for x in range(0, size, 16):
        picture.paste((240, 200, 60), (x, x, x + 16, x + 16))
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def edit_and_webhook(stack: Stack) -> None:
    task = stack.submit(
        "generateImage",
        {
            "model": "genhook/image-edit",
            "prompt": "make it brighter",
            "images": [image_data_url()],
            "size": "1024*1024",
        },
    )
    payload = stack.webhook(task)
    result = stack.result(task)
    assert result["status"] == "completed", result
    output = stack.http.get(
        result["outputs"][0], headers={"Authorization": f"Bearer {stack.api_key}"}
    )
    assert output.status_code == 200 and len(output.content) > 1000, output.status_code
    assert (
        stack.sql(f"SELECT count(*) FROM tasks WHERE id = '{task}' AND status = 'completed'") == "1"
    )
    log(
        f"edit {task}: completed, output from the bucket ({len(output.content)} bytes), "
        f"webhook {sorted(payload)[:4]}"
    )


def kill_a_worker_mid_task(stack: Stack) -> None:
    """A worker killed while running a task: the task runs again on another worker."""
    for attempt in range(3):
        task = stack.submit(
            "generateVideo",
            {
                "model": "genhook/image-to-video",
                "prompt": "a slow pan",
                "duration": 30,
                "resolution": "1080p",
                "images": [image_data_url(1024)],
            },
        )
        owner = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not owner:
            row = stack.sql(
                f"SELECT status, coalesce(lease_owner, '') FROM tasks WHERE id = '{task}'"
            )
            status, _, lease = row.partition("|")
            if status == "processing" and lease:
                owner = lease
            elif status not in ("created", "processing"):
                break
            time.sleep(0.2)
        victim = next((n for n in ("worker-1", "worker-2") if n in owner), None)
        if victim is None:
            log(f"attempt {attempt}: task {task} ended before a worker could be killed; again")
            stack.webhook(task)
            continue
        log(f"task {task} runs on {owner}: killing {victim}")
        podman("kill", "--signal", "KILL", f"{stack.pod}-{victim}")
        payload = stack.webhook(task, timeout=400)
        result = stack.result(task)
        assert result["status"] == "completed", result
        attempts = stack.sql(f"SELECT attempts, lease_losses FROM tasks WHERE id = '{task}'")
        claims, _, losses = attempts.partition("|")
        assert int(claims) >= 2 and int(losses) >= 1, attempts  # claimed again after the kill
        survivor = "worker-2" if victim == "worker-1" else "worker-1"
        log(
            f"task {task} re-ran on {survivor} after {victim} died: {claims} claims, "
            f"{losses} lost lease(s), webhook {payload.get('event_type')}"
        )
        podman("rm", "-f", f"{stack.pod}-{victim}")
        stack.run(victim, "worker", health_port=stack.health_ports[victim])  # compose restarts it
        stack.wait_healthy(victim)
        return
    raise RuntimeError("no task stayed in a worker long enough to kill it")


def scale_up_and_down(stack: Stack) -> None:
    for n in (3, 4):  # docker compose up --scale worker=4
        stack.run(f"worker-{n}", "worker", health_port=8100 + n)
    for n in (3, 4):
        stack.wait_healthy(f"worker-{n}")
    workers = stack.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    log(f"scaled up to 4 workers ({workers} advisory liveness locks held)")
    assert int(workers) >= 4, workers
    tasks = [
        stack.submit(
            "generateAudio",
            {"model": "genhook/text-to-speech", "prompt": f"Worker test number {i}."},
        )
        for i in range(4)
    ]
    for task in tasks:
        stack.webhook(task)
        assert stack.result(task)["status"] == "completed"
    for n in (3, 4):  # --scale worker=2: SIGTERM, then the grace
        podman("stop", "-t", "30", f"{stack.pod}-worker-{n}")
        code = podman(
            "inspect", "--format", "{{.State.ExitCode}}", f"{stack.pod}-worker-{n}"
        ).strip()
        assert code == "0", f"worker-{n} exited {code} on SIGTERM"
        podman("rm", f"{stack.pod}-worker-{n}")
    after = stack.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    log(f"scaled down to 2 workers: both stopped cleanly (exit 0); {after} liveness locks")
    task = stack.submit("generateAudio", {"model": "genhook/text-to-speech", "prompt": "Done."})
    stack.webhook(task)
    assert stack.result(task)["status"] == "completed"


def main() -> int:
    image, pg_image, s3_image, pod = sys.argv[1:5]
    stack = Stack(image, pg_image, s3_image, pod)
    try:
        stack.up()
        edit_and_webhook(stack)
        kill_a_worker_mid_task(stack)
        scale_up_and_down(stack)
    except Exception:
        for name in ["api", "dispatcher", "worker-1", "worker-2"]:
            logs = subprocess.run(
                [*PODMAN, "logs", "--tail", "30", f"{pod}-{name}"],
                capture_output=True,
                text=True,
                check=False,
            )
            print(f"--- {name} ---\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}", flush=True)
        raise
    finally:
        stack.close()
    log("the stack passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
