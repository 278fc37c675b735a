"""Webhook isolation benchmark: a healthy receiver's latency next to hostile receivers.

    .venv/bin/python benchmarks/webhook_fairness.py [--hostile 1000] [--rate 100]
        [--seconds 10] [--database-url URL] [--one-account] [--shared-host]
        [--hung-paths N] [--new-url-per-delivery]

``--hostile`` deliveries are made due at once to a receiver that never answers and as many
to one that answers after 5 s (both in a helper process on 127.0.0.1), with the default
settings (10 s timeout, 128 senders, 8 in flight per destination, circuit breaker after 5
failures). Then terminal transitions for a healthy receiver (the fast sink of
``webhook_delivery.py``) are committed at ``--rate`` per second for ``--seconds``, and the
terminal-to-receipt latency of each is measured. It prints the healthy side's percentiles
and, for each hostile destination, the attempts it got, what is still pending, and its
circuit state, so that both sides of the isolation can be read off.

``--shared-host`` puts the hostile side on the healthy receiver's own host:port instead:
``--hostile`` deliveries spread over ``--hung-paths`` paths of the sink that are never
answered (each with its own query, as per-task URLs have), next to the healthy path. With
``--one-account`` they are the healthy account's own; otherwise another account's. Without
``--shared-host``, ``--hung-paths`` spreads the never-answering deliveries over that many
paths. ``--new-url-per-delivery`` sends each healthy delivery to a path of its own (a task
id in the path), so that each is a new endpoint without history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import func, insert, select

sys.path.insert(0, str(Path(__file__).parent))

from webhook_delivery import Sink, make_task, payload, pct

from genhook.config import Settings
from genhook.db import (
    Account,
    Base,
    Database,
    Task,
    WebhookAttempt,
    WebhookDelivery,
    now_ms,
)
from genhook.sender.destinations import list_destinations
from genhook.sender.fairness import destination_of, endpoint_of
from genhook.sender.outbox import build_body, enqueue_delivery
from genhook.sender.service import WebhookService
from genhook.wiring import webhook_service

HANG_SECONDS = 5.0


# -- hostile receivers --------------------------------------------------------------------


class _Hostile(asyncio.Protocol):
    """Reads requests and answers each after ``delay`` seconds, or never (None)."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        if self.delay is not None:
            asyncio.get_running_loop().call_later(self.delay, self._answer)

    def _answer(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def _hostile_main(conn: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        never = await loop.create_server(lambda: _Hostile(None), "127.0.0.1", 0, backlog=1024)
        slow = await loop.create_server(
            lambda: _Hostile(HANG_SECONDS), "127.0.0.1", 0, backlog=1024
        )
        conn.send((never.sockets[0].getsockname()[1], slow.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


class Hostile:
    def __init__(self) -> None:
        parent, child = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        self.process = ctx.Process(target=_hostile_main, args=(child,), daemon=True)
        self.process.start()
        never, slow = parent.recv()
        self.never_url = f"http://127.0.0.1:{never}/hook"
        self.slow_url = f"http://127.0.0.1:{slow}/hook"

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(5)


# -- setup and measurement ----------------------------------------------------------------


async def dispatcher_ready(service: WebhookService) -> None:
    """Until the dispatcher's sessions and attempt feed are ready."""
    while service.dispatcher is None:
        await asyncio.sleep(0.01)
    await service.dispatcher.started.wait()


async def enqueue_hostile(db: Database, url: str, prefix: str, count: int, account: str) -> None:
    if not count:
        return
    now = now_ms()
    tasks, deliveries = [], []
    for i in range(count):
        task = make_task(f"{prefix}{i:06d}", url, now)
        task.account_id = account
        body = build_body(task, "image.task.terminal", payload(task))
        tasks.append({c.name: getattr(task, c.name) for c in Task.__table__.columns})
        deliveries.append(
            dict(
                id=f"whd_{prefix}{i:06d}",
                task_id=task.id,
                account_id=account,
                url=url,
                destination=destination_of(url),
                endpoint=endpoint_of(url),
                event_type="image.task.terminal",
                body=body,
                status="pending",
                attempts=0,
                round_start=0,
                redeliveries=0,
                next_attempt_at=now,
                created_at=now,
                updated_at=now,
            )
        )
    async with db.write() as session:
        await session.execute(insert(Task), tasks)
        await session.execute(insert(WebhookDelivery), deliveries)


async def shared_host_report(db: Database, account: str, elapsed: float) -> dict[str, Any]:
    """The hung paths' attempts, what is still pending and how many endpoint circuits opened."""
    hung = WebhookDelivery.endpoint.like("%/hung/%")
    async with db.read() as session:
        attempts = await session.scalar(
            select(func.count())
            .select_from(WebhookAttempt)
            .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
            .where(hung)
        )
        rows = (
            await session.execute(
                select(WebhookDelivery.status, func.count())
                .where(hung)
                .group_by(WebhookDelivery.status)
            )
        ).all()
    circuits: dict[str, int] = {}
    for view in (await list_destinations(db, account_id=account)).data:
        for endpoint in view.endpoints:
            if "/hung/" in endpoint.endpoint:
                circuits[endpoint.state] = circuits.get(endpoint.state, 0) + 1
    return {
        "attempts_recorded": int(attempts or 0),
        "statuses": {status: int(n) for status, n in rows},
        "endpoint_circuits": circuits,
        "seconds": round(elapsed, 1),
    }


async def hostile_report(db: Database, url: str, elapsed: float) -> dict[str, Any]:
    destination = destination_of(url)
    async with db.read() as session:
        attempts = await session.scalar(
            select(func.count())
            .select_from(WebhookAttempt)
            .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
            .where(WebhookDelivery.destination == destination)
        )
        rows = (
            await session.execute(
                select(WebhookDelivery.status, func.count())
                .where(WebhookDelivery.destination == destination)
                .group_by(WebhookDelivery.status)
            )
        ).all()
    endpoint = endpoint_of(url)
    host, circuit = "closed", "closed"
    for view in (await list_destinations(db, account_id=None)).data:
        if view.destination == destination:
            host = view.state
            circuit = next((e.state for e in view.endpoints if e.endpoint == endpoint), circuit)
    return {
        "attempts_recorded": int(attempts or 0),
        "statuses": {status: int(n) for status, n in rows},
        "circuit": circuit,
        "host_circuit": host,
        "seconds": round(elapsed, 1),
    }


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="genhook-fair-"))
    url = args.database_url or f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
    settings = Settings(
        data_dir=tmp,
        database_url=url,
        webhook_allow_private_targets=True,
        log_level="ERROR",
    )
    db = Database(url)
    async with db.write_engine.begin() as conn:
        await conn.run_sync(Base.metadata.drop_all)
        await conn.run_sync(Base.metadata.create_all)
    hostile_account = "acct_bench" if args.one_account else "acct_hostile"
    async with db.write() as session:
        session.add(Account(id="acct_bench", name="b", signing_secret="whsec_b", created_at=0))
        if not args.one_account:
            session.add(
                Account(id="acct_hostile", name="h", signing_secret="whsec_h", created_at=0)
            )
    sink = Sink()
    hostile = None if args.shared_host else Hostile()
    results: dict[str, Any] = {
        "database": db.dialect,
        "hostile_each": args.hostile,
        "shared_host": args.shared_host,
        "one_account": args.one_account,
        "hung_paths": args.hung_paths,
        "new_url_per_delivery": args.new_url_per_delivery,
    }
    stop = asyncio.Event()
    try:
        if hostile is None:
            base = f"http://127.0.0.1:{sink.port}/hung"
            paths = max(1, args.hung_paths or 50)
            for p in range(paths):
                count = args.hostile // paths + (p < args.hostile % paths)
                url = f"{base}/{p}?task=per-task-token"
                await enqueue_hostile(db, url, f"hung{p:03d}_", count, hostile_account)
        else:
            paths = max(1, args.hung_paths or 1)
            for p in range(paths):
                count = args.hostile // paths + (p < args.hostile % paths)
                url = hostile.never_url if paths == 1 else f"{hostile.never_url}/{p}"
                await enqueue_hostile(db, url, f"never{p:03d}_", count, hostile_account)
            await enqueue_hostile(db, hostile.slow_url, "slow", args.hostile, hostile_account)
        service = webhook_service(settings, db)
        run = asyncio.create_task(service.run(stop))
        await dispatcher_ready(service)
        begin = time.perf_counter()
        # Let the hostile backlog take what it can first.
        await asyncio.sleep(1.0)
        committed: dict[str, float] = {}
        total = int(args.rate * args.seconds)
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = now_ms()
            # A new endpoint per delivery, as for clients putting a task id in the path.
            target = f"{sink.url}/{i}" if args.new_url_per_delivery else sink.url
            task = make_task(f"ok{i:06d}", target, now)
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
        enqueued_in = time.perf_counter() - start
        async with aiohttp.ClientSession() as client:
            deadline = time.perf_counter() + 30
            received: dict[str, float] = {}
            while time.perf_counter() < deadline:
                received = await sink.stats(client)
                if len(received) >= total:
                    break
                await asyncio.sleep(0.1)
        latencies = sorted((received[k] - committed[k]) * 1000 for k in committed if k in received)
        elapsed = time.perf_counter() - begin
        if hostile is None:
            report = await shared_host_report(db, hostile_account, elapsed)
            results["hung paths"] = report
            print(f"{paths} hung paths of the healthy host: {json.dumps(report)}")
        else:
            for name, target in (
                ("never answers", hostile.never_url),
                ("hangs 5 s", hostile.slow_url),
            ):
                report = await hostile_report(db, target, elapsed)
                results[name] = report
                print(f"hostile receiver that {name}: {json.dumps(report)}")
        if latencies:
            p50, p99 = pct(latencies, 50), pct(latencies, 99)
            print(
                f"healthy receiver at {args.rate:g}/s (n={len(latencies)} of {total}): "
                f"p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {latencies[-1]:.1f} ms"
            )
            print(
                f"  (offered {total / enqueued_in:.0f}/s: the commits themselves keep pace or not)"
            )
            results.update(
                healthy_offered_per_s=round(total / enqueued_in, 1),
                healthy_received=len(latencies),
                healthy_sent=total,
                healthy_p50_ms=round(p50, 1),
                healthy_p99_ms=round(p99, 1),
                healthy_max_ms=round(latencies[-1], 1),
            )
        stop.set()
        await run
    finally:
        stop.set()
        if hostile is not None:
            hostile.stop()
        sink.stop()
        await db.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostile", type=int, default=1000, help="Deliveries per hostile host.")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--one-account", action="store_true", help="Hostile and healthy alike.")
    parser.add_argument(
        "--shared-host", action="store_true", help="Hung paths on the healthy receiver's host."
    )
    parser.add_argument(
        "--hung-paths",
        type=int,
        default=None,
        help="Paths the never-answering deliveries spread over (default 50 with "
        "--shared-host, else 1).",
    )
    parser.add_argument(
        "--new-url-per-delivery",
        action="store_true",
        help="Each healthy delivery to a path of its own (a task id in the path).",
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
