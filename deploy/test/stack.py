"""deploy/compose.yaml, run for real with podman-compose (scripts/deploy-test.sh).

The compose file as an operator runs it, with deploy/test/compose.test.yaml on top (the
PostgreSQL and S3 images built from Debian's packages instead of registry images): the
migration, one api, two workers and one dispatcher on their compose network. Then: an edit is
submitted and its signed webhook received on the host; a worker is killed in the middle of a
task and the task runs again; workers are scaled up to four (`up --scale worker=4`) and back
down to two, gracefully.

The stack comes up in the order its depends_on states, one step at a time (`up --no-deps`),
each step waited for here with a deadline: podman before 4.6 cannot wait for a health check
(`condition: service_healthy` is skipped), and podman 4.3 refuses to start a container whose
`--requires` chain holds a container that has exited (the bucket, the migration).

Usage: python deploy/test/stack.py PODMAN_COMPOSE PROJECT
(GENHOOK_IMAGE, GENHOOK_TEST_POSTGRES_IMAGE, GENHOOK_TEST_S3_IMAGE name the images.)
The caller removes every container, volume and network of PROJECT afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from genhook.client import WebhookVerifier

ROOT = Path(__file__).resolve().parents[2]
PODMAN = os.environ.get("PODMAN", "podman").split()
FILES = ["-f", str(ROOT / "deploy/compose.yaml"), "-f", str(ROOT / "deploy/test/compose.test.yaml")]


def log(message: str) -> None:
    print(f"[stack {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(command: list[str], check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env=os.environ
    )
    if check and done.returncode != 0:
        output = done.stderr[-3000:] + done.stdout[-1000:]
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{output}")
    return done.stdout


def podman(*args: str, check: bool = True, timeout: float = 300) -> str:
    return run([*PODMAN, *args], check=check, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(ready: Callable[[], Any], what: str, timeout: float) -> None:
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


class Receiver:
    """An HTTP receiver on the host, on the compose network's gateway address (the host's end
    of that bridge, reached from the containers only), that keeps every webhook it gets."""

    def __init__(self, host: str) -> None:
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

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stack:
    def __init__(self, compose: str, project: str) -> None:
        self.project = project
        self.compose = [*compose.split(), "--in-pod", "false", "-p", project, *FILES]
        self.api_port = free_port()
        os.environ["GENHOOK_API_PORT"] = str(self.api_port)
        os.environ["GENHOOK_PUBLIC_BASE_URL"] = f"http://127.0.0.1:{self.api_port}"
        os.environ["GENHOOK_WEBHOOK_ENCRYPTION_KEY"] = (
            base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        )
        self.base = f"http://127.0.0.1:{self.api_port}"
        self.http = httpx.Client(timeout=30)
        self.receiver: Receiver | None = None
        self.api_key = ""
        self.verifier = WebhookVerifier(jwks_url=f"{self.base}/api/v1/webhooks/jwks.json")
        self.verified: list[dict[str, Any]] = []

    def container(self, service: str, n: int = 1) -> str:
        return f"{self.project}_{service}_{n}"

    def up(self, *args: str) -> None:
        """podman-compose up -d --no-deps ARGS: one step of the start order."""
        run([*self.compose, "up", "-d", "--no-deps", "--no-build", *args])

    def start(self) -> None:
        log(f"project {self.project}: api on 127.0.0.1:{self.api_port}")
        self.up("postgres", "s3")
        self.wait_healthy("postgres")  # service_healthy; the S3 store: the bucket step waits
        gateway = podman(
            "network", "inspect", f"{self.project}_default", "--format",
            "{{range .Subnets}}{{.Gateway}}{{end}}",
        ).strip()  # fmt: skip
        self.receiver = Receiver(gateway)
        log(f"receiver on {self.receiver.url}")
        # service_completed_successfully, one at a time: a container that starts or exits
        # makes podman 4.3's DNS server (aardvark-dns) reload, and a name looked up meanwhile
        # may not resolve.
        for service in ("bucket", "migrate"):
            self.up(service)
            code = podman("wait", self.container(service), timeout=300).strip()
            if code != "0":
                logs = podman("logs", "--tail", "30", self.container(service), check=False)
                raise RuntimeError(f"{service} exited {code}:\n{logs}")
        log("bucket made, schema migrated (genhook db upgrade)")
        answer = run(
            [*self.compose, "run", "--rm", "--no-deps", "--entrypoint", "genhook", "migrate",
             "accounts", "create", "deploy-test", "--json"]
        )  # fmt: skip
        self.api_key = json.loads(answer[answer.index("{") :])["api_key"]
        self.up("api", "worker", "dispatcher")
        wait(lambda: self.http.get(f"{self.base}/readyz").status_code == 200, "api ready", 180)
        for service, n in [("api", 1), ("dispatcher", 1), ("worker", 1), ("worker", 2)]:
            self.wait_healthy(service, n)

    def wait_healthy(self, service: str, n: int = 1, timeout: float = 180) -> None:
        """The service's health check passes (run here: podman's timer needs systemd)."""
        name = self.container(service, n)
        wait(
            lambda: (
                subprocess.run(
                    [*PODMAN, "healthcheck", "run", name],
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

    def workers(self) -> dict[str, str]:
        """Each running worker container by its host name (the lease owner names it)."""
        names = podman(
            "ps", "--filter", f"label=io.podman.compose.project={self.project}",
            "--filter", "label=io.podman.compose.service=worker", "--format", "{{.Names}}",
        ).split()  # fmt: skip
        return {
            podman("inspect", "--format", "{{.Config.Hostname}}", name).strip(): name
            for name in names
        }

    def submit(self, path: str, body: dict[str, Any]) -> str:
        assert self.receiver is not None
        body = {**body, "webhook_url": self.receiver.url}
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
        assert self.receiver is not None
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
            "exec", self.container("postgres"),
            "psql", "-h", "127.0.0.1", "-U", "genhook", "-d", "genhook", "-tAc", query,
        ).strip()  # fmt: skip

    def close(self) -> None:
        if self.receiver is not None:
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
    """A worker that dies while running a task (SIGKILL to its process, as the kernel's OOM
    killer would; `podman kill` would count as a stop by hand and skip the restart policy):
    the task runs again, and the restart policy (`unless-stopped`) brings the container back."""
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
        victim = next((name for host, name in stack.workers().items() if host in owner), None)
        if victim is None:
            log(f"attempt {attempt}: task {task} ended before a worker could be killed; again")
            stack.webhook(task)
            continue
        log(f"task {task} runs on {owner}: killing {victim}")
        os.kill(int(podman("inspect", "--format", "{{.State.Pid}}", victim)), signal.SIGKILL)
        payload = stack.webhook(task, timeout=400)
        result = stack.result(task)
        assert result["status"] == "completed", result
        attempts = stack.sql(f"SELECT attempts, lease_losses FROM tasks WHERE id = '{task}'")
        claims, _, losses = attempts.partition("|")
        assert int(claims) >= 2 and int(losses) >= 1, attempts  # claimed again after the kill
        log(
            f"task {task} re-ran after {victim} died: {claims} claims, "
            f"{losses} lost lease(s), webhook {payload.get('event_type')}"
        )
        stack.wait_healthy("worker", int(victim.rsplit("_", 1)[1]))
        restarts = podman("inspect", "--format", "{{.RestartCount}}", victim).strip()
        assert int(restarts) >= 1, f"{victim} was not restarted"
        log(f"{victim} is back: restarted by its restart policy, healthy")
        return
    raise RuntimeError("no task stayed in a worker long enough to kill it")


def scale_up_and_down(stack: Stack) -> None:
    stack.up("--scale", "worker=4", "worker")
    for n in (3, 4):
        stack.wait_healthy("worker", n)
    workers = stack.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    log(f"scaled up to 4 workers ({workers} advisory liveness locks held)")
    assert int(workers) >= 4, workers
    assert len(stack.workers()) == 4, stack.workers()
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
    # Back to two: what `docker compose up --scale worker=2` does (podman-compose's --scale
    # only adds): SIGTERM to the surplus replicas, then the grace, then removal.
    for n in (3, 4):
        name = stack.container("worker", n)
        podman("stop", "-t", "30", name, timeout=60)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).strip()
        assert code == "0", f"{name} exited {code} on SIGTERM"
        podman("rm", "-v", name)
    assert len(stack.workers()) == 2, stack.workers()
    after = stack.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    log(f"scaled down to 2 workers: both stopped cleanly (exit 0); {after} liveness locks")
    task = stack.submit("generateAudio", {"model": "genhook/text-to-speech", "prompt": "Done."})
    stack.webhook(task)
    assert stack.result(task)["status"] == "completed"


def main() -> int:
    compose, project = sys.argv[1:3]
    stack = Stack(compose, project)
    try:
        stack.start()
        edit_and_webhook(stack)
        kill_a_worker_mid_task(stack)
        scale_up_and_down(stack)
    except Exception:
        names = podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
            "--format", "{{.Names}}", check=False,
        ).split()  # fmt: skip
        for name in names:
            logs = subprocess.run(
                [*PODMAN, "logs", "--tail", "30", name],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            print(f"--- {name} ---\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}", flush=True)
        raise
    finally:
        stack.close()
    log("the compose stack passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
