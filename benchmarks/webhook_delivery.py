"""Webhook delivery benchmark: sustained signed deliveries/s of the dispatcher role, run as
deployed (``genhook dispatcher`` processes), against a bare aiohttp ceiling; and
terminal-to-receipt latency at a fixed offered rate.

    .venv/bin/python benchmarks/webhook_delivery.py [--count 6000] [--processes 1 2]
        [--rate 200] [--seconds 10] [--database-url URL]

A fast sink (a minimal HTTP/1.1 keep-alive responder on httptools, 127.0.0.1) runs in its
own process and records when each delivery arrives. Throughput: ``--count`` deliveries are
made due at once and one, then two, dispatcher processes (claims, signing with HMAC +
Ed25519, keep-alive sessions, batched outcome writes) deliver them; in the same run a bare
aiohttp loop in this process POSTs the same bodies to the same sink with the same
concurrency, the ceiling. Latency: terminal transitions are committed one per transaction
at ``--rate`` per second for ``--seconds`` by this process, as a worker would; latency is
from each commit to the sink's receipt, with one dispatcher process woken by each commit
(``genhook.db.wakeups``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httptools
from sqlalchemy import insert, update

from genhook.config import Settings
from genhook.db import Account, Database, Task, WebhookDelivery, now_ms
from genhook.db.migrate import upgrade
from genhook.sender.fairness import destination_of, endpoint_of
from genhook.sender.outbox import build_body, enqueue_delivery, wake_dispatchers

CONCURRENCY = 128
# CPU microseconds per delivery, per measurement: this process for the bare loop, the
# dispatcher processes for the service (the sink's process excluded), and of those their
# event loops' threads alone (the thread that bounds one process: the GIL's holder).
CPU_US: dict[str, list[float]] = {"bare": [], "signed": [], "signed_loop": []}


# -- the sink -----------------------------------------------------------------------------


class _SinkProtocol(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive responder (httptools' parser): it answers every POST
    /hook with 200 and notes when each webhook id arrived. It is the same for both sides of
    the comparison and kept as light as possible, so that on a 2-core machine it takes
    little CPU from either the service or the bare loop."""

    def __init__(self, received: dict[str, float]) -> None:
        self.received = received
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.hook_id = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.hook_id = ""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-service-webhook-id":
            self.hook_id = value.decode()

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.url.startswith(b"/hung/"):
            return  # never answered: the hung endpoints of webhook_fairness.py's shared host
        body = b"ok"
        content_type = b"text/plain"
        if self.url == b"/hook" or self.url.startswith(b"/hook/"):
            self.received[self.hook_id] = time.time()
        elif self.url == b"/count":
            body = str(len(self.received)).encode()
        elif self.url == b"/stats":
            body, content_type = json.dumps(self.received).encode(), b"application/json"
        elif self.url == b"/reset":
            self.received.clear()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: "
            + content_type
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        if not self.parser.should_keep_alive():
            self.transport.close()


def _sink_main(conn: Any) -> None:
    received: dict[str, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _SinkProtocol(received), "127.0.0.1", 0, backlog=1024
        )
        conn.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())


class Sink:
    def __init__(self) -> None:
        parent, child = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        self.process = ctx.Process(target=_sink_main, args=(child,), daemon=True)
        self.process.start()
        self.port: int = parent.recv()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(f"http://127.0.0.1:{self.port}/stats") as r:
            data: dict[str, float] = await r.json()
            return data

    async def count(self, session: aiohttp.ClientSession) -> int:
        async with session.get(f"http://127.0.0.1:{self.port}/count") as r:
            return int(await r.read())

    async def reset(self, session: aiohttp.ClientSession) -> None:
        async with session.post(f"http://127.0.0.1:{self.port}/reset") as r:
            await r.read()

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(5)


# -- fixtures -----------------------------------------------------------------------------

PAYLOAD_OUTPUTS = ["https://genhook.example/api/v1/outputs/" + "a" * 40 + ".jpeg"]


def make_task(task_id: str, url: str, now: int) -> Task:
    return Task(
        id=task_id,
        account_id="acct_bench",
        model="genhook/image-edit",
        kind="image",
        status="completed",
        params={"prompt": "make the sky purple", "size": "1024*1024"},
        inputs=[],
        webhook_url=url,
        created_at=now,
        updated_at=now,
        available_at=now,
        deadline_at=now + 300_000,
        finished_at=now,
        attempts=1,
        lease_losses=0,
        outputs=["x.jpeg"],
        has_nsfw_contents=[False],
        info={},
        charge={},
    )


def payload(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "model": task.model,
        "status": task.status,
        "outputs": PAYLOAD_OUTPUTS,
        "has_nsfw_contents": [False],
        "created_at": "2026-11-22T08:00:00.000Z",
        "urls": {"get": f"https://genhook.example/api/v1/model/result/{task.id}"},
    }


async def bulk_enqueue(db: Database, url: str, prefix: str, count: int) -> list[bytes]:
    """Tasks and due deliveries, inserted in bulk (setup, not measured)."""
    now = now_ms()
    bodies: list[bytes] = []
    for start in range(0, count, 1000):
        tasks, deliveries = [], []
        for i in range(start, min(count, start + 1000)):
            task = make_task(f"{prefix}{i:06d}", url, now)
            body = build_body(task, "image.task.terminal", payload(task))
            bodies.append(body)
            tasks.append({c.name: getattr(task, c.name) for c in Task.__table__.columns})
            deliveries.append(
                dict(
                    id=f"whd_{prefix}{i:06d}",
                    task_id=task.id,
                    account_id="acct_bench",
                    url=url,
                    destination=destination_of(url),
                    endpoint=endpoint_of(url),
                    event_type="image.task.terminal",
                    body=body,
                    status="pending",
                    attempts=0,
                    round_start=0,
                    redeliveries=0,
                    next_attempt_at=2**62,  # made due all at once when the run starts
                    created_at=now,
                    updated_at=now,
                )
            )
        async with db.write() as session:
            await session.execute(insert(Task), tasks)
            await session.execute(insert(WebhookDelivery), deliveries)
    return bodies


# -- measurements -------------------------------------------------------------------------


async def bare_ceiling(url: str, bodies: list[bytes]) -> float:
    """The same bodies, same sink, same concurrency, no database and no signing."""
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(enumerate(bodies))

        async def worker() -> None:
            for i, body in queue:
                headers = {"Content-Type": "application/json", "X-Service-Webhook-Id": f"bare{i}"}
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - started
        CPU_US["bare"].append((time.process_time() - cpu) / len(bodies) * 1e6)
        return len(bodies) / elapsed


async def delivered_count(db: Database) -> int:
    """Delivered rows, counted on the (status, next_attempt_at) index."""
    from sqlalchemy import func, select

    async with db.read() as session:
        count = await session.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .where(WebhookDelivery.status == "delivered")
        )
    return int(count or 0)


async def wait_delivered(db: Database, target: int, interval: float = 0.05) -> None:
    while await delivered_count(db) < target:
        await asyncio.sleep(interval)


def process_cpu(pids: list[int], *, loop_only: bool = False) -> float:
    """CPU seconds used so far by other processes (the dispatchers), from /proc; with
    ``loop_only``, by their main threads (the event loops) alone."""
    total = 0.0
    for pid in pids:
        stat = f"/proc/{pid}/task/{pid}/stat" if loop_only else f"/proc/{pid}/stat"
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Dispatchers:
    """``genhook dispatcher`` processes, as deployed, each ready on its health port."""

    def __init__(self, settings: Settings, count: int) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        env = {
            **os.environ,
            "GENHOOK_DATA_DIR": str(settings.data_dir),
            "GENHOOK_DATABASE_URL": settings.resolved_database_url,
            "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
            "GENHOOK_WEBHOOK_CONCURRENCY": str(settings.webhook_concurrency),
            "GENHOOK_LOG_LEVEL": "WARNING",
        }
        for _ in range(count):
            port = free_port()
            self.ports.append(port)
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "genhook.cli",
                        "dispatcher",
                        "--health-port",
                        str(port),
                    ],
                    env=env,
                )
            )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    async def ready(self, client: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for process, port in zip(self.processes, self.ports, strict=True):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"a dispatcher exited with {process.returncode}")
                try:
                    async with client.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("a dispatcher never became ready")
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                code = process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait(5)
            if code != 0:
                print(f"dispatcher {process.pid} exited with {code}", flush=True)


async def service_throughput(
    settings: Settings,
    db: Database,
    sink: Sink,
    client: aiohttp.ClientSession,
    prefix: str,
    count: int,
    delivered_after: int,
    processes: int,
) -> float:
    dispatchers = Dispatchers(settings, processes)
    try:
        await dispatchers.ready(client)
        # Every delivery of the round becomes due at once; the clock starts when they are.
        started, cpu = time.perf_counter(), process_cpu(dispatchers.pids)
        loop_cpu = process_cpu(dispatchers.pids, loop_only=True)
        async with db.write() as session:
            await session.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.id.like(f"whd_{prefix}%"))
                .values(next_attempt_at=0)
            )
            # As an enqueue does: the commit wakes the dispatchers (genhook.db.wakeups).
            await wake_dispatchers(session)
        # Watch the sink's count first, so the measurement itself does not load the
        # database; then wait for every outcome to be recorded.
        while await sink.count(client) < count:
            await asyncio.sleep(0.01)
        await wait_delivered(db, delivered_after, interval=0.01)
        elapsed = time.perf_counter() - started
        CPU_US["signed"].append((process_cpu(dispatchers.pids) - cpu) / count * 1e6)
        loop_cpu = process_cpu(dispatchers.pids, loop_only=True) - loop_cpu
        CPU_US["signed_loop"].append(loop_cpu / count * 1e6)
    finally:
        dispatchers.stop()
    return count / elapsed


async def latency(
    settings: Settings,
    db: Database,
    sink: Sink,
    client: aiohttp.ClientSession,
    prefix: str,
    rate: float,
    seconds: float,
) -> list[float]:
    dispatchers = Dispatchers(settings, 1)
    try:
        await dispatchers.ready(client)
        committed: dict[str, float] = {}
        baseline = await delivered_count(db)
        total = int(rate * seconds)
        interval = 1.0 / rate
        begin = time.perf_counter()
        for i in range(total):
            target = begin + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = now_ms()
            task = make_task(f"{prefix}{i:06d}", sink.url, now)
            async with db.write() as session:
                session.add(task)
                await session.flush()
                await enqueue_delivery(
                    session,
                    task=task,
                    event_type="image.task.terminal",
                    payload=payload(task),
                    now=now,
                )
            committed[task.id] = time.time()
        await wait_delivered(db, baseline + total)
    finally:
        dispatchers.stop()
    received = await sink.stats(client)
    return sorted((received[k] - t) * 1000 for k, t in committed.items())


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="genhook-bench-"))
    url = args.database_url or f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
    settings = Settings(
        data_dir=tmp,
        database_url=url,
        webhook_allow_private_targets=True,
        webhook_concurrency=CONCURRENCY,
        log_level="WARNING",
    )
    # The dispatcher role refuses a database below the newest schema.
    await asyncio.to_thread(upgrade, url)
    db = Database(url)
    async with db.write() as session:
        session.add(
            Account(id="acct_bench", name="bench", signing_secret="whsec_bench", created_at=0)
        )
    sink = Sink()
    results: dict[str, Any] = {"database": db.dialect, "count": args.count, "loop": args.loop}
    try:
        async with aiohttp.ClientSession() as client:
            # Best of --rounds for each side, interleaved, so a noisy neighbour on a shared
            # machine penalizes neither side more than the other.
            ceilings: list[float] = []
            signed_rates: dict[int, list[float]] = {n: [] for n in args.processes}
            cpu_by: dict[int, list[tuple[float, float]]] = {n: [] for n in args.processes}
            delivered = 0
            bodies: list[bytes] = []
            for round_no in range(args.rounds):
                for processes in args.processes:
                    prefix = f"tp{round_no}x{processes}"
                    bodies = await bulk_enqueue(db, sink.url, prefix, args.count)
                    await sink.reset(client)
                    ceilings.append(await bare_ceiling(sink.url, bodies))
                    await sink.reset(client)
                    delivered += args.count
                    rate = await service_throughput(
                        settings, db, sink, client, prefix, args.count, delivered, processes
                    )
                    signed_rates[processes].append(rate)
                    cpu_by[processes].append((CPU_US["signed"][-1], CPU_US["signed_loop"][-1]))
                    print(
                        f"round {round_no + 1}, {processes} dispatcher process(es): "
                        f"signed {rate:,.0f}/s ({CPU_US['signed'][-1]:.0f} us CPU each, "
                        f"{CPU_US['signed_loop'][-1]:.0f} on the event loops), "
                        f"bare {ceilings[-1]:,.0f}/s ({CPU_US['bare'][-1]:.0f} us CPU each)",
                        flush=True,
                    )
            ceiling = max(ceilings)
            print(
                f"body size {len(bodies[0])} bytes; {args.count} deliveries per round", flush=True
            )
            results["ceiling_per_s"] = round(ceiling)
            results["cpu_us_bare"] = round(statistics.median(CPU_US["bare"]))
            for processes, rates in signed_rates.items():
                signed = max(rates)
                results[f"signed_per_s_{processes}"] = round(signed)
                results[f"ratio_{processes}"] = round(signed / ceiling, 3)
                cpu, loop_cpu = (statistics.median(c) for c in zip(*cpu_by[processes], strict=True))
                results[f"cpu_us_{processes}"] = round(cpu)
                results[f"cpu_us_loop_{processes}"] = round(loop_cpu)
                print(
                    f"{processes} dispatcher process(es): signed deliveries/s {signed:,.0f}  "
                    f"bare aiohttp ceiling {ceiling:,.0f}  ratio {signed / ceiling:.0%}  "
                    f"(median CPU per delivery: {cpu:.0f} us, event loops {loop_cpu:.0f} us; "
                    f"bare {results['cpu_us_bare']} us)",
                    flush=True,
                )
            if args.seconds > 0:
                await sink.reset(client)
                lat = await latency(settings, db, sink, client, "lp", args.rate, args.seconds)
                results["latency_poll_p50_ms"] = round(pct(lat, 50), 1)
                results["latency_poll_p99_ms"] = round(pct(lat, 99), 1)
                results["latency_poll_max_ms"] = round(lat[-1], 1)
                print(
                    f"terminal-to-receipt at {args.rate:g}/s (another process, woken at commit, "
                    f"n={len(lat)}): p50 {pct(lat, 50):.1f} ms  p99 {pct(lat, 99):.1f} ms  "
                    f"max {lat[-1]:.1f} ms  mean {statistics.fmean(lat):.1f} ms",
                    flush=True,
                )
    finally:
        sink.stop()
        await db.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=6000, help="Deliveries per round.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 2], help="Dispatcher processes."
    )
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="0 skips the latency run.")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="Event loop of the bare ceiling; the dispatcher role runs on uvloop when installed.",
    )
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    sys.exit(asyncio.run(main(args)))
