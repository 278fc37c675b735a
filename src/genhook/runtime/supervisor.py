"""The supervisor of ``genhook serve``: starts, restarts and stops the role processes.

``genhook serve`` migrates and bootstraps with the whole service imported, binds the API's
socket, then replaces itself (``os.execv``, same pid) with ``python -m genhook.runtime.supervisor
FD``: this module, which imports only the standard library, so the process that lives as
long as the service holds about 22 MB instead of 100. ``FD`` is an open file holding the
supervisor's configuration as JSON (see ``exec_supervisor``).

What a dead child held in the database (a worker's tasks, a dispatcher's deliveries) is given
back by a living dispatcher, which has a database handle and reads such requests on its
standard input (``RELEASE`` lines), so a killed worker's task runs again within a fraction of
a second. With no dispatcher alive, a short-lived ``genhook.runtime.lifeline`` process of role
``release`` does it: the supervisor itself has no database handle.

Stopping is bounded: workers and the api get ``grace`` seconds and ``STOP_MARGIN`` more to
finish or give back their tasks, then the dispatchers get ``DISPATCHER_GRACE`` of their own
to send the last callbacks and let go of their leases, and whatever a killed child held is
given back within ``RELEASE_AT_STOP``: the whole stop takes at most ``grace`` plus
``STOP_MARGIN + DISPATCHER_GRACE + RELEASE_AT_STOP`` seconds (and the kill's reaping).

A role that cannot start at all (a broken install, say: an import that fails) would otherwise
be restarted for ever while the service looks up. One that exits with an error
``START_ATTEMPTS`` times in a row, each time within ``START_SECONDS`` of its start, without
ever having run longer, stops the whole service (exit status 1), as supervisord's
``startretries`` does. A role that did run a while is always restarted: its later failures
(the database gone for a minute) may pass.
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
# Past the grace, how long a worker has to give back its task and leave before it is killed.
STOP_MARGIN = 1.0
# The dispatchers' own grace, once the workers are gone: the last tasks' callbacks go out.
DISPATCHER_GRACE = 5.0
# How long a stopping supervisor waits for what killed children held to be given back.
RELEASE_AT_STOP = 2.0
# The first word of a line a dispatcher reads on its standard input: give back what a dead
# sibling held (``RELEASE tasks|deliveries OWNER lost|stopped``).
RELEASE = "release"
# A child that exits within this many seconds of its start has failed to start.
START_SECONDS = 5.0
# Failed starts in a row, of a role that never ran longer (or that says it could not start),
# after which the service stops.
START_ATTEMPTS = 5
# The exit status of a child that could not start, however long it tried (a worker whose
# models to preload cannot load): a failed start, even after ``START_SECONDS``, and even of
# a role that ran a while before.
EXIT_CANNOT_START = 4


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
    # Whether any run of this role lasted ``START_SECONDS``: then it is always restarted.
    came_up: bool = False

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def exited(self, now: float, code: int) -> bool:
        """Count an exit; True when the role cannot start and the service must stop. An
        exit by a signal (a kill from outside, negative ``code``) is no failure of its own."""
        if code == EXIT_CANNOT_START:
            self.failures += 1
            return self.failures >= START_ATTEMPTS
        if now - self.started_at < START_SECONDS:
            self.failures += 1
        else:
            self.failures = 1
            self.came_up = True
        return not self.came_up and code > 0 and self.failures >= START_ATTEMPTS


class Supervisor:
    """Starts, restarts and stops role processes, and gives back what a dead one held.

    Children are plain processes (``python -m genhook.runtime.lifeline PARENT LIFELINE ROLE
    INDEX``); each reads ``payload`` (its settings as JSON) on standard input and watches
    this process's lifeline, a pipe whose write end only this process holds (the kernel
    closes it when this process dies, however it dies: ``lifeline.die_with_parent``).
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
        # The role that could not start, when that stopped the service.
        self.failed: str | None = None
        self._signalled: set[int] = set()
        self._releases: set[asyncio.Task[None]] = set()
        self._exited = asyncio.Event()
        # Nothing is ever written to it: every child waits for its end of file. The write
        # end is never inherited (PEP 446), so it closes with this process.
        self._lifeline, self._lifeline_write = os.pipe()

    def _spawn(
        self, args: list[str], fds: tuple[int, ...] = (), *, keep_stdin: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start a child; its settings go first on its standard input, one line. A
        dispatcher's stays open for ``RELEASE`` requests."""
        lifeline = str(self._lifeline)
        argv = [sys.executable, "-m", "genhook.runtime.lifeline", str(os.getpid()), lifeline, *args]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(self._lifeline, *fds))
        assert process.stdin is not None
        try:
            process.stdin.write(self.payload + b"\n")
            process.stdin.flush()
            if not keep_stdin:
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
        child.process = self._spawn(args, fds, keep_stdin=child.role == "dispatcher")
        child.started_at = time.monotonic()

    def start(self) -> None:
        for child in self.children:
            self._start(child)

    async def supervise(self, interval: float = 5.0) -> None:
        """Restart children as they exit, until a stop or a role that cannot start (then
        ``failed`` names it). SIGCHLD wakes this loop; ``interval`` is only its fallback, so
        an idle supervisor sleeps."""
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
                give_up = child.exited(now, code)
                child.process = None
                self._release_later(child, process.pid, lost=code != 0)
                if give_up:
                    log.error(
                        "%s failed at each of its last %d starts, the last with status %s "
                        "(its error is above); stopping the service",
                        child.name,
                        child.failures,
                        code,
                    )
                    self.failed = child.name
                    return
                # A child that keeps dying at start waits longer each time.
                delay = backoff_delay(child.failures - 1, 0.5, 5.0) if child.failures > 1 else 0.0
                log.warning("%s exited with %s; restarting", child.name, code)
                loop.call_later(delay, self._restart, child)

    def _restart(self, child: Child) -> None:
        if not self.stopping and child.process is None:
            self._start(child)

    def _release_later(self, child: Child, pid: int, *, lost: bool) -> None:
        task = asyncio.create_task(self._give_back(child, pid, lost=lost))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _give_back(self, child: Child, pid: int, *, lost: bool) -> None:
        """Give back what the dead ``child`` (pid ``pid``) held: through a living dispatcher
        when there is one, else in a release process."""
        if child.role not in ("worker", "dispatcher"):
            return
        if child.role == "worker":
            args = ["tasks", worker_id_for(pid, child.index)]
        else:
            args = ["deliveries", dispatcher_owner_for(pid, child.index)]
        args.append("lost" if lost else "stopped")
        if self._ask_dispatcher(" ".join([RELEASE, *args])):
            return
        process = self._spawn(["release", *args])
        try:
            code = await asyncio.to_thread(process.wait, RELEASE_TIMEOUT)
        except (subprocess.TimeoutExpired, asyncio.CancelledError):
            process.kill()
            await asyncio.to_thread(process.wait)
            code = None
        if code != 0:
            log.error("could not give back what %s held; its leases will", child.name)

    def _ask_dispatcher(self, line: str) -> bool:
        """Hand ``line`` to a living dispatcher; False when none took it."""
        for child in self.children:
            process = child.process
            if child.role != "dispatcher" or process is None or process.poll() is not None:
                continue
            if process.pid in self._signalled or process.stdin is None:
                continue
            try:
                process.stdin.write(line.encode() + b"\n")
                process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                continue
            return True
        return False

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
        """Workers and the api first, within ``grace`` (and ``STOP_MARGIN``); then the
        dispatchers, within ``DISPATCHER_GRACE`` of their own; then what a killed child held
        is given back, within ``RELEASE_AT_STOP``."""
        self.begin_stop()
        await self._stop_roles(("worker", "api"), grace + STOP_MARGIN)
        self._signal(("dispatcher",))
        await self._stop_roles(("dispatcher",), DISPATCHER_GRACE)
        if self._releases:
            _, late = await asyncio.wait(self._releases, timeout=RELEASE_AT_STOP)
            for task in late:  # the leases give those back
                task.cancel()
            if late:
                await asyncio.wait(late)

    async def _stop_roles(self, roles: tuple[str, ...], within: float) -> None:
        """Wait up to ``within`` seconds for the signalled children of ``roles`` to exit, then
        kill the rest, giving back what they held."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        for child in self.children:
            if child.role in roles and child.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    remaining = max(0.0, deadline - loop.time())
                    await asyncio.to_thread(child.process.wait, remaining)
        for child in self.children:
            process = child.process
            if child.role in roles and process is not None and process.poll() is None:
                log.warning("%s did not stop in time; killing it", child.name)
                process.kill()
                await asyncio.to_thread(process.wait, 5)
                self._release_later(child, process.pid, lost=False)


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
    os.execv(sys.executable, [sys.executable, "-m", "genhook.runtime.supervisor", str(fd)])  # noqa: S606


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
    if supervisor.failed is not None:
        sys.exit(1)


async def _supervise(supervisor: Supervisor, grace: float) -> None:
    """Until SIGTERM or SIGINT, or a role that cannot start; then stop every child."""
    stop = asyncio.Event()
    # Children also receive a terminal's Ctrl-C; they stop gracefully on their own.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    supervisor.start()
    watch = asyncio.create_task(supervisor.supervise())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((watch, stopping), return_when=asyncio.FIRST_COMPLETED)
        if watch.done() and watch.exception() is not None:
            log.error("supervising failed; stopping the service", exc_info=watch.exception())
            supervisor.failed = "supervisor"
        supervisor.begin_stop()
    finally:
        watch.cancel()
        stopping.cancel()
        await supervisor.stop(grace)


if __name__ == "__main__":
    main()
