"""Programmable webhook receivers on loopback (HTTP, or HTTPS with a trustme CA), and a
small database fixture builder for the webhook tests."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web

from genhook.config import Settings
from genhook.db import Account, Base, Database, Task, now_ms
from genhook.sender.fairness import Rooms, Stop
from genhook.sender.feed import LocalFeed
from genhook.sender.outbox import enqueue_delivery
from genhook.sender.queue import UNLIMITED, Outcome, Ticked

Behaviour = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers each request with ``behaviour(request, n)`` (n counts from 1)."""

    behaviour: Behaviour
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.path, dict(request.headers), body))
        self.arrived.set()
        return await self.behaviour(request, len(self.received))

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def wait_for(self, count: int, timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()


def status(code: int, **headers: str) -> Behaviour:
    async def answer(_: web.Request, __: int) -> web.StreamResponse:
        return web.Response(status=code, text=f"answer {code}", headers=headers)

    return answer


def sequence(*codes: int) -> Behaviour:
    """The n-th request gets ``codes[n-1]`` (the last code repeats)."""

    async def answer(_: web.Request, n: int) -> web.StreamResponse:
        code = codes[min(n, len(codes)) - 1]
        return web.Response(status=code, text=f"answer {code}")

    return answer


@dataclass
class Tls:
    ca: trustme.CA
    server: ssl.SSLContext
    client: ssl.SSLContext
    ca_file: Path


def make_tls(tmp_path: Path, *hostnames: str) -> Tls:
    ca = trustme.CA()
    cert = ca.issue_cert(*hostnames)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Tls(ca, server, client, ca_file)


class MapResolver:
    """Answers from a table that tests may change between calls."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return list(self.table.get(host, []))


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Refuses, and records, any connect to a non-loopback address."""
    refused: list[object] = []
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if host is None or not ipaddress.ip_address(str(host).split("%")[0]).is_loopback:
            refused.append(address)
            raise ConnectionRefusedError(f"test guard: {address!r} is not loopback")
        real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield refused
    assert refused == [], f"non-loopback connections attempted: {refused}"


# For tests that check attempt logs one attempt at a time against receivers that answer at
# once: no attempt may time out on a loaded machine, where the suite's 2 s is not always
# enough. Tests that need a timeout or a lease to run out keep the short default.
PATIENT_TIMEOUT_SECONDS = 15.0


def webhook_settings(tmp_path: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": database_url,
        "public_base_url": "http://testserver",
        "webhook_allow_private_targets": True,
        "webhook_timeout_seconds": 2.0,
        "webhook_retry_base_seconds": 0.05,
        "webhook_retry_cap_seconds": 0.2,
        "webhook_retry_max_attempts": 10,
        "webhook_poll_seconds": 0.01,
        "webhook_reconcile_interval_seconds": 0.2,
    }
    values.update(overrides)
    return Settings(**values)


async def create_schema(db: Database) -> None:
    async with db.write_engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)


async def add_account(db: Database, account_id: str = "acct_1", secret: str = "whsec_test") -> None:
    async with db.write() as session:
        session.add(Account(id=account_id, name=account_id, signing_secret=secret, created_at=0))


async def two_accounts(database_url: str) -> Database:
    """A database with the schema and two accounts, ``acct_1`` and ``acct_2``."""
    db = Database(database_url)
    await create_schema(db)
    await add_account(db, "acct_1")
    await add_account(db, "acct_2")
    return db


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)


async def delivery_database(settings: Settings) -> Database:
    """The settings' database with the schema, one account and a signing key: what a
    dispatcher needs to deliver."""
    from genhook.sender.keys import ensure_signing_key

    db = Database(settings.resolved_database_url)
    await create_schema(db)
    await add_account(db)
    await ensure_signing_key(db, settings)
    return db


class FeedWrapper:
    """A dispatcher's feed (``Dispatcher.feed``) with hooks around each exchange."""

    def __init__(self, feed: LocalFeed) -> None:
        self.feed = feed

    @property
    def claims_alone(self) -> bool:
        return self.feed.claims_alone

    async def start(self) -> None:
        await self.feed.start()

    async def close(self) -> None:
        await self.feed.close()

    def before(self, outcomes: Sequence[Outcome]) -> None:
        """Called before each exchange; may raise, as the exchange would."""

    def after(self, outcomes: Sequence[Outcome], limit: int, ticked: Ticked) -> None:
        """Called after each exchange that succeeded."""

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
        inline: bool = False,
        stops: Sequence[Stop] = (),
    ) -> Ticked:
        self.before(outcomes)
        ticked = await self.feed.exchange(
            outcomes, limit, rooms, returned, inline=inline, stops=stops
        )
        self.after(outcomes, limit, ticked)
        return ticked


def terminal_task(
    task_id: str,
    url: str | None,
    *,
    status: str = "completed",
    account_id: str = "acct_1",
    error_code: int | None = None,
    error_message: str | None = None,
    finished_at: int | None = None,
) -> Task:
    now = now_ms()
    return Task(
        id=task_id,
        account_id=account_id,
        model="genhook/image-edit",
        kind="image",
        status=status,
        params={"prompt": "p"},
        inputs=[],
        webhook_url=url,
        created_at=1_700_000_000_123,
        updated_at=now,
        available_at=now,
        deadline_at=now + 60_000,
        finished_at=finished_at if finished_at is not None else now,
        attempts=1,
        lease_losses=0,
        outputs=["out/1.jpeg"] if status == "completed" else [],
        has_nsfw_contents=[False] if status == "completed" else [],
        info={},
        charge={},
        error_code=error_code,
        error_message=error_message,
    )


def payload_for(task: Task) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": task.id,
        "model": task.model,
        "status": task.status,
        "outputs": ["http://testserver/api/v1/outputs/out/1.jpeg"]
        if task.status == "completed"
        else [],
        "has_nsfw_contents": [False] if task.status == "completed" else [],
        "created_at": "2023-11-14T22:13:20.123Z",
        "urls": {"get": f"http://testserver/api/v1/model/result/{task.id}"},
    }
    return payload


async def enqueue(db: Database, task: Task) -> str:
    """Commit ``task`` and its outbox row together, as a terminal transition does."""
    async with db.write() as session:
        session.add(task)
        await session.flush()
        return await enqueue_delivery(
            session,
            task=task,
            event_type="image.task.terminal",
            payload=payload_for(task),
            now=now_ms(),
        )
