"""The supervisor of ``genhook serve``: starts, restarts and stops the role processes.

``genhook serve`` migrates and bootstraps with the whole service imported, binds the API's
socket, then replaces itself (``os.execv``, same pid) with ``python -m genhook.supervisor
FD``: this module, which imports only the standard library, so the process that lives as
long as the service holds about 22 MB instead of 100. ``FD`` is an open file holding the
supervisor's configuration as JSON (see ``exec_supervisor``).

What a dead child held in the database (a worker's tasks, a dispatcher's deliveries) is given
back by a short-lived ``genhook.lifeline`` process of role ``release``: the supervisor itself
has no database handle, and a child dies rarely enough for that start-up to be cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from genhook.retry import backoff_delay

log = logging.getLogger("genhook")

# How long a release process may take before its leases are left to do the job.
RELEASE_TIMEOUT = 60.0


def worker_id_for(pid: int, index: int) -> str:
    """The lease owner name of worker ``index`` running as ``pid`` on this machine."""
    return f"{socket.gethostname()}:{pid}/{index}"


def dispatcher_owner_for(pid: int, index: int) -> str:
    """The delivery lease owner name of dispatcher ``index`` running as ``pid``."""
    return f"{socket.gethostname()}:{pid}/dispatcher-{index}"


@dataclass
class Child:
    """One supervised role process, restarted under the same role and index."""

    role: str
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


class Supervisor:
    """Starts, restarts and stops role processes, and gives back what a dead one held.

    Children are plain processes (``python -m genhook.lifeline PARENT ROLE INDEX``) started
    from the main thread, so the kernel's parent-death signal follows this process, not a
    helper thread; each reads ``payload`` (its settings as JSON) on standard input.
    ``listen_fd`` is the API's listening socket, opened once so that the port stays open
    while an API process restarts.
    """

    def __init__(
        self,
        children: list[tuple[str, int]],
        payload: bytes,
        *,
        listen_fd: int | None = None,
    ) -> None:
        self.children = [Child(role, index) for role, index in children]
        self.payload = payload
        self.listen_fd = listen_fd
        self.stopping = False
        self._signalled: set[int] = set()
        self._releases: set[asyncio.Task[None]] = set()
        self._exited = asyncio.Event()

    def _spawn(self, args: list[str], fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "genhook.lifeline", str(os.getpid()), *args]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=fds)
        assert process.stdin is not None
        try:
            process.stdin.write(self.payload)
            process.stdin.close()
        except BrokenPipeError:
            pass
        return process

    def _start(self, child: Child) -> None:
        args = [child.role, str(child.index)]
        fds: tuple[int, ...] = ()
        if child.role == "api" and self.listen_fd is not None:
            args.append(str(self.listen_fd))
            fds = (self.listen_fd,)
        child.process = self._spawn(args, fds)
        child.started_at = time.monotonic()

    def start(self) -> None:
        for child in self.children:
            self._start(child)

    async def supervise(self, interval: float = 5.0) -> None:
        """Restart children as they exit. SIGCHLD wakes this loop; ``interval`` is only its
        fallback, so an idle supervisor sleeps."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGCHLD, self._exited.set)
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), interval)
            self._exited.clear()
            now = time.monotonic()
            for child in self.children:
                process = child.process
                if process is None or self.stopping:
                    continue
                code = process.poll()
                if code is None:
                    continue
                # A child that keeps dying at start waits longer each time.
                child.failures = child.failures + 1 if now - child.started_at < 5 else 1
                delay = backoff_delay(child.failures - 1, 0.5, 5.0) if child.failures > 1 else 0.0
                log.warning("%s exited with %s; restarting", child.name, code)
                child.process = None
                self._release_later(child, process.pid, lost=code != 0)
                loop.call_later(delay, self._restart, child)

    def _restart(self, child: Child) -> None:
        if not self.stopping and child.process is None:
            self._start(child)

    def _release_later(self, child: Child, pid: int, *, lost: bool) -> None:
        task = asyncio.create_task(self._give_back(child, pid, lost=lost))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _give_back(self, child: Child, pid: int, *, lost: bool) -> None:
        """Give back what the dead ``child`` (pid ``pid``) held, in a release process."""
        if child.role not in ("worker", "dispatcher"):
            return
        if child.role == "worker":
            args = ["release", "tasks", worker_id_for(pid, child.index)]
        else:
            args = ["release", "deliveries", dispatcher_owner_for(pid, child.index)]
        args.append("lost" if lost else "stopped")
        process = self._spawn(args)
        try:
            code = await asyncio.to_thread(process.wait, RELEASE_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
            code = None
        if code != 0:
            log.error("could not give back what %s held; its leases will", child.name)

    def _signal(self, roles: tuple[str, ...]) -> None:
        """SIGTERM once to each child of ``roles``: a second one means "now" to uvicorn."""
        for child in self.children:
            process = child.process
            if child.role not in roles or process is None or process.pid in self._signalled:
                continue
            self._signalled.add(process.pid)
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)

    def begin_stop(self) -> None:
        """Stop every claim now: each worker finishes or releases its task, the API stops.
        Dispatchers stop after the workers, to send the callbacks of their last tasks."""
        self.stopping = True
        self._signal(("api", "worker"))

    async def stop(self, grace: float) -> None:
        self.begin_stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace + 2
        for role in ("worker", "api", "dispatcher"):
            self._signal((role,))
            for child in self.children:
                if child.role == role and child.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        remaining = max(0.0, deadline - loop.time())
                        await asyncio.to_thread(child.process.wait, remaining)
        for child in self.children:
            process = child.process
            if process is not None and process.poll() is None:
                log.warning("%s did not stop in time; killing it", child.name)
                process.kill()
                await asyncio.to_thread(process.wait, 5)
                self._release_later(child, process.pid, lost=False)
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)


def exec_supervisor(
    data_dir: Path,
    children: list[tuple[str, int]],
    payload: bytes,
    *,
    listen_fd: int,
    grace: float,
    log_level: str,
    log_format: str,
) -> None:
    """Become the lean supervisor: the same process, with nothing of the start-up left.

    The configuration goes through an unlinked file in ``data_dir`` (private, any size)
    whose descriptor the new program inherits."""
    import tempfile  # here: the supervisor that runs after the exec goes without it

    config = {
        "children": children,
        "payload": payload.decode(),
        "listen_fd": listen_fd,
        "grace": grace,
        "log_level": log_level,
        "log_format": log_format,
    }
    with tempfile.TemporaryFile(dir=data_dir) as handle:
        handle.write(json.dumps(config).encode())
        handle.flush()
        fd = os.dup(handle.fileno())  # a plain descriptor, outliving the Python file object
    os.set_inheritable(fd, True)
    os.lseek(fd, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "genhook.supervisor", str(fd)])  # noqa: S606


def main() -> None:
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as handle:
        config: dict[str, Any] = json.loads(handle.read())
    from genhook.logs import configure_logging

    settings: Any = SimpleNamespace(log_level=config["log_level"], log_format=config["log_format"])
    configure_logging(settings, "serve")
    children = [(str(role), int(index)) for role, index in config["children"]]
    listen_fd = int(config["listen_fd"])
    supervisor = Supervisor(children, config["payload"].encode(), listen_fd=listen_fd)
    try:
        asyncio.run(_supervise(supervisor, float(config["grace"])))
    finally:
        os.close(listen_fd)


async def _supervise(supervisor: Supervisor, grace: float) -> None:
    stop = asyncio.Event()
    # Children also receive a terminal's Ctrl-C; they stop gracefully on their own.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    supervisor.start()
    watch = asyncio.create_task(supervisor.supervise())
    try:
        await stop.wait()
        supervisor.begin_stop()
    finally:
        watch.cancel()
        await supervisor.stop(grace)


if __name__ == "__main__":
    main()
