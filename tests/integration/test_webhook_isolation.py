"""Isolation on one shared host:port: many paths of one receiver, and several accounts
sending to it. Each endpoint (URL without its query) of each account has its own share and
circuit, so hung or failing paths hold back neither a healthy path of the same account nor
another account's; a 429 with Retry-After and a 410 Gone are honoured per endpoint."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from sqlalchemy import select

from genhook.accounts import create_account
from genhook.config import Settings
from genhook.db import Database, WebhookAttempt, WebhookDelivery
from genhook.sender.destinations import list_destinations, record_transitions
from genhook.sender.fairness import Transition
from genhook.wiring import webhook_service
from tests.conftest import make_harness, make_settings
from tests.integration.test_console import signed_in
from tests.support.webhook_receiver import (
    Receiver,
    enqueue,
    terminal_task,
    two_accounts,
    wait_until,
    webhook_settings,
)


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(
        tmp_path,
        database_url,
        # 16 senders per account, 4 of them kept for fast endpoints and first attempts.
        webhook_concurrency=32,
        webhook_destination_max_in_flight=3,
        webhook_timeout_seconds=20.0,
    )
    db = await two_accounts(database_url)
    yield settings, db
    await db.dispose()


async def deliveries(db: Database, ids: list[str]) -> list[WebhookDelivery]:
    async with db.read() as session:
        rows = await session.scalars(select(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
        return sorted(rows, key=lambda row: ids.index(row.id))


async def attempts_of(db: Database, ids: list[str]) -> list[WebhookAttempt]:
    async with db.read() as session:
        rows = await session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_(ids))
            .order_by(WebhookAttempt.id)
        )
        return list(rows)


def all_in(db: Database, ids: list[str], status: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return [d.status for d in await deliveries(db, ids)] == [status] * len(ids)

    return check


async def serve(settings: Settings, db: Database, work: Callable[[], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    run = asyncio.create_task(webhook_service(settings, db).run(stop))
    try:
        await work()
    finally:
        stop.set()
        await run


async def test_hung_paths_do_not_hold_a_healthy_path_of_the_same_host_and_account(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    release = asyncio.Event()
    hung_now: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async def behaviour(request: web.Request, _: int) -> web.StreamResponse:
        if request.path.startswith("/hang/"):
            hung_now[request.path] += 1
            most[request.path] = max(most[request.path], hung_now[request.path])
            try:
                await release.wait()
            finally:
                hung_now[request.path] -= 1
        return web.Response(status=200)

    receiver = await Receiver(behaviour).start()
    base = f"http://127.0.0.1:{receiver.port}"
    try:
        # Twelve paths that hang, due first, three deliveries each (with a per-task query).
        hung = [
            await enqueue(db, terminal_task(f"t_hang_{p}_{n}", f"{base}/hang/{p}?task={n}"))
            for p in range(12)
            for n in range(3)
        ]

        async def work() -> None:
            await receiver.wait_for(12)
            good = [
                await enqueue(db, terminal_task(f"t_good_{n}", f"{base}/good?task={n}"))
                for n in range(20)
            ]
            await wait_until(all_in(db, good, "delivered"))
            # Every healthy delivery went out, each on its first attempt, while every hung
            # path still held what it had: one attempt each, not having answered yet.
            assert not release.is_set()
            assert all(d.attempts == 1 for d in await deliveries(db, good))
            assert sum(hung_now.values()) == 12
            assert set(most.values()) == {1}
            release.set()
            await wait_until(all_in(db, hung, "delivered"), timeout=60.0)
            # Each owed attempt went once; none was lost or doubled.
            paths = Counter(r.path for r in receiver.received)
            assert all(paths[f"/hang/{p}"] == 3 for p in range(12))
            assert paths["/good"] == 20

        await serve(settings, db, work)
    finally:
        release.set()
        await receiver.stop()


@pytest.mark.parametrize("same_host", [True, False], ids=["same-host", "other-host"])
async def test_a_new_path_per_delivery_never_waits_behind_48_hung_paths_of_its_account(
    env: tuple[Settings, Database], same_host: bool
) -> None:
    """Clients that put a task id in the path make every webhook a new endpoint: with no
    history of its own, each must still go out at once while 48 paths of the account hang,
    whether on its host or on another one."""
    settings, db = env
    # 32 senders for the account, 8 of them its reserve: fewer than the hung paths.
    settings = settings.model_copy(update={"webhook_concurrency": 64})
    release = asyncio.Event()
    hung_now: Counter[str] = Counter()

    async def behaviour(request: web.Request, _: int) -> web.StreamResponse:
        if request.path.startswith("/hang/"):
            hung_now[request.path] += 1
            try:
                await release.wait()
            finally:
                hung_now[request.path] -= 1
        return web.Response(status=200)

    receiver = await Receiver(behaviour).start()
    other = await Receiver(behaviour).start() if not same_host else receiver
    base = f"http://127.0.0.1:{receiver.port}"
    hung_base = f"http://127.0.0.1:{other.port}"
    try:
        hung = [
            await enqueue(db, terminal_task(f"t_hang_{p}_{n}", f"{hung_base}/hang/{p}?task={n}"))
            for p in range(48)
            for n in range(3)
        ]

        async def work() -> None:
            await other.wait_for(32)
            good: list[str] = []
            for n in range(20):
                good.append(await enqueue(db, terminal_task(f"t_new_{n}", f"{base}/task/{n}")))
                await wait_until(all_in(db, good, "delivered"))
            # Every new path went out on its first attempt while the hung ones still hung:
            # none of them has ended an attempt yet.
            assert not release.is_set()
            assert all(d.attempts == 1 for d in await deliveries(db, good))
            assert not await attempts_of(db, hung)
            assert sum(hung_now.values()) >= 32
            release.set()
            await wait_until(all_in(db, hung, "delivered"), timeout=60.0)
            paths = Counter(r.path for r in receiver.received)
            assert all(paths[f"/task/{n}"] == 1 for n in range(20))

        await serve(settings, db, work)
    finally:
        release.set()
        await receiver.stop()
        if other is not receiver:
            await other.stop()


async def test_one_accounts_failing_path_never_delays_another_accounts_path(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    settings = settings.model_copy(
        update={
            "webhook_breaker_failures": 3,
            "webhook_breaker_cooldown_seconds": 0.3,
            "webhook_retry_max_attempts": 4,
        }
    )

    async def behaviour(request: web.Request, _: int) -> web.StreamResponse:
        return web.Response(status=500 if request.path == "/bad" else 200)

    receiver = await Receiver(behaviour).start()
    base = f"http://127.0.0.1:{receiver.port}"
    try:
        bad = [
            await enqueue(db, terminal_task(f"t_bad_{n}", f"{base}/bad?n={n}")) for n in range(8)
        ]

        async def work() -> None:
            async def opened() -> bool:
                view = await list_destinations(db, account_id="acct_1")
                return any(e.state == "open" for d in view.data for e in d.endpoints)

            await wait_until(opened)
            good = [
                await enqueue(
                    db,
                    terminal_task(f"t_good_{n}", f"{base}/good?n={n}", account_id="acct_2"),
                )
                for n in range(3)
            ]
            await wait_until(all_in(db, good, "delivered"))
            # acct_2's deliveries each went on their first attempt: acct_1's circuit,
            # probes and backoff on the same host never held them.
            rows = await deliveries(db, good)
            assert [d.attempts for d in rows] == [1, 1, 1]

            # Half-open probes came, and only ever for acct_1's failing endpoint.
            async def probed() -> bool:
                log = [a.error or "" for a in await attempts_of(db, bad)]
                return any("half-open probe" in e for e in log)

            await wait_until(probed)
            bad_log = [a.error or "" for a in await attempts_of(db, bad)]
            assert any("endpoint circuit opened" in e for e in bad_log)
            good_log = await attempts_of(db, good)
            assert all(a.error is None and a.status_code == 200 for a in good_log)

            # Each account sees only its own endpoints' state.
            [mine] = (await list_destinations(db, account_id="acct_2")).data
            assert mine.account_id == "acct_2"
            assert (mine.state, mine.consecutive_failures, mine.last_error) == ("closed", 0, None)
            assert [(e.endpoint, e.state, e.last_error) for e in mine.endpoints] == [
                (f"{base}/good", "closed", None)
            ]
            [theirs] = (await list_destinations(db, account_id="acct_1")).data
            assert [e.endpoint for e in theirs.endpoints] == [f"{base}/bad"]
            assert theirs.endpoints[0].last_error is not None
            assert theirs.state == "closed"  # the host itself answered every time
            # Operators see both.
            every = (await list_destinations(db, account_id=None)).data
            assert {d.account_id for d in every} == {"acct_1", "acct_2"}

        await serve(settings, db, work)
    finally:
        await receiver.stop()


async def test_429_with_retry_after_holds_that_endpoint_only(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    settings = settings.model_copy(update={"webhook_destination_max_in_flight": 1})
    answered: list[tuple[str, int, float]] = []

    async def behaviour(request: web.Request, _: int) -> web.StreamResponse:
        now = asyncio.get_running_loop().time()
        if request.path == "/busy" and not any(code == 429 for _, code, _ in answered):
            answered.append((request.path, 429, now))
            return web.Response(status=429, headers={"Retry-After": "1"})
        answered.append((request.path, 200, now))
        return web.Response(status=200)

    receiver = await Receiver(behaviour).start()
    base = f"http://127.0.0.1:{receiver.port}"
    try:
        busy = [
            await enqueue(db, terminal_task(f"t_busy_{n}", f"{base}/busy?n={n}")) for n in range(4)
        ]
        other = [
            await enqueue(db, terminal_task(f"t_other_{n}", f"{base}/other?n={n}"))
            for n in range(4)
        ]

        async def work() -> None:
            await wait_until(all_in(db, busy + other, "delivered"))

        await serve(settings, db, work)
        # One 429, then nothing to that endpoint until Retry-After had passed; the other
        # endpoint of the host was not held.
        [(_, _, refused_at)] = [a for a in answered if a[1] == 429]
        later = [at for path, code, at in answered if path == "/busy" and code == 200]
        assert len(later) == 4
        assert min(later) - refused_at >= 0.95
        log = await attempts_of(db, busy)
        assert [a.status_code for a in log].count(429) == 1
        assert sum(d.attempts for d in await deliveries(db, busy)) == 5
        assert all(d.attempts == 1 for d in await deliveries(db, other))
    finally:
        await receiver.stop()


async def test_410_gone_stops_that_endpoints_pending_deliveries_of_that_account(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    settings = settings.model_copy(update={"webhook_destination_max_in_flight": 1})

    async def behaviour(request: web.Request, _: int) -> web.StreamResponse:
        return web.Response(status=410 if request.path == "/gone" else 200)

    receiver = await Receiver(behaviour).start()
    base = f"http://127.0.0.1:{receiver.port}"
    try:
        gone = [
            await enqueue(db, terminal_task(f"t_gone_{n}", f"{base}/gone?n={n}")) for n in range(5)
        ]
        kept = [await enqueue(db, terminal_task("t_kept", f"{base}/kept"))]
        theirs = [
            await enqueue(db, terminal_task("t_theirs", f"{base}/gone?n=9", account_id="acct_2"))
        ]

        async def work() -> None:
            await wait_until(all_in(db, gone + theirs, "undeliverable"))
            await wait_until(all_in(db, kept, "delivered"))

        await serve(settings, db, work)
        rows = await deliveries(db, gone)
        # One attempt got the 410; the others stopped unsent, saying why.
        assert sum(d.attempts for d in rows) == 1
        assert all("410 Gone" in (d.last_error or "") for d in rows)
        stopped = [d for d in rows if d.attempts == 0]
        assert len(stopped) == 4 and all(d.next_attempt_at is None for d in stopped)
        # Another account's delivery to the same endpoint was tried on its own.
        [their] = await deliveries(db, theirs)
        assert their.attempts == 1 and their.last_status_code == 410
        assert Counter(r.path for r in receiver.received)["/gone"] == 2
    finally:
        await receiver.stop()


async def test_an_account_sees_only_its_own_circuits_and_operators_see_all(
    tmp_path: Path, database_url: str
) -> None:
    settings = make_settings(tmp_path, database_url)
    harness = await make_harness(settings)
    db = harness.state.db
    try:
        other = await create_account(db, "other")
        mine_id, theirs_id = harness.account.account_id, other.account_id
        host = "https://hooks.example:443"
        await enqueue(db, terminal_task("t_mine", f"{host}/shared", account_id=mine_id))
        await enqueue(db, terminal_task("t_theirs", f"{host}/shared", account_id=theirs_id))
        # The other account's deliveries to the very same endpoint failed and opened its
        # circuit; this account's never did.
        await record_transitions(
            db,
            [
                Transition(
                    theirs_id, "endpoint", f"{host}/shared", "open", 5, 1, 2, "HTTP 503 theirs", 1
                )
            ],
        )
        theirs = {"Authorization": f"Bearer {other.api_key}"}
        mine = await harness.client.get("/api/v1/webhooks/destinations", headers=harness.headers)
        [view] = mine.json()["data"]
        assert view["account_id"] == mine_id
        assert [(e["state"], e["last_error"]) for e in view["endpoints"]] == [("closed", None)]
        assert "theirs" not in mine.text
        their = await harness.client.get("/api/v1/webhooks/destinations", headers=theirs)
        [view] = their.json()["data"]
        assert [(e["state"], e["last_error"]) for e in view["endpoints"]] == [
            ("open", "HTTP 503 theirs")
        ]
        # The console shows the same, per account.
        page = await (await signed_in(harness, harness.account.api_key)).get("/console/deliveries")
        assert "HTTP 503 theirs" not in page.text and "Every circuit is closed" in page.text
        page = await (await signed_in(harness, other.api_key)).get("/console/deliveries")
        assert "HTTP 503 theirs" in page.text
        # Operators see every account's; other keys are refused.
        listing = "/api/v1/admin/destinations"
        assert (await harness.client.get(listing, headers=theirs)).status_code == 403
        harness.state.settings.admin_accounts.append(mine_id)
        every = (await harness.client.get(listing, headers=harness.headers)).json()["data"]
        assert sorted(v["account_id"] for v in every) == sorted([mine_id, theirs_id])
        page = await (await signed_in(harness, harness.account.api_key)).get(
            "/console/deliveries?scope=all"
        )
        assert "HTTP 503 theirs" in page.text
    finally:
        await harness.client.aclose()
        await db.dispose()
