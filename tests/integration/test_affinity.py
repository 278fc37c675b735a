"""Affinity: a task of a model with affinity (a local model) goes preferably to a worker that
has the model loaded; one without takes it only once it has waited the affinity time. The
fake model ``test/affine`` stands in for the weights, ``Worker.resident`` for what is loaded."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from genhook.engines.registry import build_registry
from genhook.tasks import Worker
from tests.conftest import ROOT, Harness, make_harness, make_settings
from tests.support import engines as support
from tests.support.engines import AFFINE
from tests.support.images import data_url


def body(number: int = 0) -> dict[str, Any]:
    return {
        "model": AFFINE.id,
        "prompt": f"edit {number}",
        "size": "1024*1024",
        "output_format": "png",
        "images": [data_url((1, 2, 3))],
    }


async def harness(tmp_path: Path, database_url: str, engines: str, **extra: Any) -> Harness:
    settings = make_settings(
        tmp_path, database_url, extra_engines=[f"tests.support.engines:{engines}"], **extra
    )
    return await make_harness(settings)


@pytest.fixture
async def running() -> AsyncIterator[list[tuple[Harness, asyncio.Event, asyncio.Task[None]]]]:
    started: list[tuple[Harness, asyncio.Event, asyncio.Task[None]]] = []
    yield started
    for h, stop, task in started:
        stop.set()
        await task
        await h.client.aclose()
        await h.state.db.dispose()


def start(h: Harness, runs: list[tuple[Harness, asyncio.Event, asyncio.Task[None]]]) -> None:
    stop = asyncio.Event()
    runs.append((h, stop, asyncio.create_task(h.worker.run(stop))))


@pytest.mark.parametrize("engines", ["register_affine", "register_affine_and_io"])
async def test_a_worker_without_the_model_leaves_a_fresh_task_in_either_loop(
    engines: str, tmp_path: Path, database_url: str, running: list[Any]
) -> None:
    """The one-at-a-time loop and the loop of several calls at once (a model of concurrency
    4 beside) both hold a fresh task back."""
    h = await harness(
        tmp_path, database_url, engines, local_models_affinity_seconds=30, worker_poll_seconds=0.1
    )
    support.affine_loaded = frozenset()  # nothing loaded here
    start(h, running)
    task_id = (await h.submit(body())).json()["id"]
    await asyncio.sleep(1.5)
    assert (await h.result(task_id))["status"] == "created"


async def test_affinity_off_holds_nothing_back(tmp_path: Path, database_url: str) -> None:
    """A wait of 0 turns affinity off: no hold, and an idle worker polls at its usual pace."""
    h = await harness(
        tmp_path,
        database_url,
        "register_affine",
        local_models_affinity_seconds=0,
        worker_poll_seconds=5,
    )
    try:
        h.worker.resident = frozenset
        assert h.worker.hold_ms() is None
        assert h.worker.idle_poll() == h.state.settings.worker_poll_seconds
        h.state.settings.local_models_affinity_seconds = 2
        assert h.worker.hold_ms() == {AFFINE.id: 2000} and h.worker.idle_poll() == 2
    finally:
        await h.client.aclose()
        await h.state.db.dispose()


async def test_on_sqlite_a_fresh_task_wakes_the_worker_that_has_the_model(
    tmp_path: Path,
) -> None:
    """On SQLite a submit wakes one idle worker alone: never one that would hold the task
    back for another, so of two idle ``genhook worker`` processes the one with the model
    takes each task at once, and the one without it never does."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'genhook.db'}"
    h = await harness(tmp_path, url, "register_affine")
    environment = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(h.state.settings.data_dir),
        "GENHOOK_DATABASE_URL": url,
        "GENHOOK_EXTRA_ENGINES": '["tests.support.engines:register_affine"]',
        "GENHOOK_LOCAL_MODELS_AFFINITY_SECONDS": "2",
        "GENHOOK_WORKER_POLL_SECONDS": "5",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    workers: dict[int, str] = {}
    running: list[subprocess.Popen[bytes]] = []
    logs = {kind: tmp_path / f"{kind}.log" for kind in ("warm", "cold")}
    try:
        for kind, log_path in logs.items():
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.affine_worker", kind],
                    env=environment,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            workers[process.pid] = kind
            running.append(process)
        async with asyncio.timeout(60):
            while not all(b" started (models" in log.read_bytes() for log in logs.values()):
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # both idle
        takers = []
        for number in range(8):
            task_id = (await h.submit(body(number))).json()["id"]
            async with asyncio.timeout(30):
                while (result := await h.result(task_id))["status"] in ("created", "processing"):
                    await asyncio.sleep(0.02)
            takers.append(workers.get(result["info"]["pid"]))
            await asyncio.sleep(0.2)  # idle again
        assert takers == ["warm"] * 8, logs["cold"].read_text()
    finally:
        for process in running:
            process.terminate()
        for process in running:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        await h.client.aclose()
        await h.state.db.dispose()


@pytest.mark.parametrize("order", ["interleaved", "grouped"])
async def test_a_backlog_keeps_each_worker_on_its_model(
    order: str, tmp_path: Path, database_url: str
) -> None:
    """Two workers, two models with affinity, room for one model per worker: 20 tasks
    submitted at once make at most 2 model switches (each worker drains the tasks of the
    model it holds before it takes another's; 6 to 10 switches when the oldest task won)."""
    support.devices.clear()
    settings = make_settings(
        tmp_path,
        database_url,
        extra_engines=["tests.support.engines:register_resident_pair"],
        local_models_affinity_seconds=2,
        worker_poll_seconds=0.1,
    )
    h = await make_harness(settings)
    state = h.state
    other = Worker(
        settings, state.db, state.storage, build_registry(settings), state.policy, "w-other"
    )
    first, second = support.devices
    model_a, model_b = support.RESIDENT_MODELS
    first.loaded, second.loaded = frozenset({model_a}), frozenset({model_b})
    stops = [asyncio.Event(), asyncio.Event()]
    runs = [asyncio.create_task(w.run(s)) for w, s in zip((h.worker, other), stops, strict=True)]
    try:
        if order == "interleaved":
            models = [model_a, model_b] * 10
        else:
            models = [model_a] * 10 + [model_b] * 10
        submits = [
            h.submit({**body(number), "model": model}) for number, model in enumerate(models)
        ]
        ids = [response.json()["id"] for response in await asyncio.gather(*submits)]
        async with asyncio.timeout(120):
            for task_id in ids:
                while (await h.result(task_id))["status"] in ("created", "processing"):
                    await asyncio.sleep(0.05)
        ended = [(await h.result(task_id))["status"] for task_id in ids]
        assert ended == ["completed"] * len(ids)
        switches = first.switches + second.switches
        assert switches <= 2, (switches, first.calls, second.calls)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*runs)
        await h.client.aclose()
        await h.state.db.dispose()


async def adapter_workers(
    tmp_path: Path, database_url: str, **extra: Any
) -> tuple[Harness, Worker, list[support.OneAdapterDevice]]:
    """Two workers holding ``ADAPTER_MODEL`` loaded, the first with adapter ``film``, the
    other with ``noir``."""
    support.adapter_devices.clear()
    settings = make_settings(
        tmp_path,
        database_url,
        extra_engines=["tests.support.engines:register_adapter_model"],
        **extra,
    )
    h = await make_harness(settings)
    state = h.state
    other = Worker(
        settings, state.db, state.storage, build_registry(settings), state.policy, "w-other"
    )
    devices = list(support.adapter_devices)
    devices[0].adapters, devices[1].adapters = frozenset({"film"}), frozenset({"noir"})
    return h, other, devices


def adapter_body(number: int, adapter: str) -> dict[str, Any]:
    return {**body(number), "model": support.ADAPTER_MODEL, "loras": [{"name": adapter}]}


async def test_among_a_held_models_tasks_each_worker_takes_its_adapters(
    tmp_path: Path, database_url: str
) -> None:
    """Two workers hold one model, each with another adapter: of a backlog of both adapters'
    tasks (the other's oldest), each takes the tasks of the adapter it holds and loads
    none (oldest first, 3 loads: both take the noir tasks, then both the film tasks)."""
    h, other, (first, second) = await adapter_workers(tmp_path, database_url)
    try:
        assert h.worker.registry.resident_adapters() == {support.ADAPTER_MODEL: {"film"}}
        adapters = ["noir"] * 3 + ["film"] * 3
        ids = [(await h.submit(adapter_body(n, a))).json()["id"] for n, a in enumerate(adapters)]
        for _ in range(3):
            assert await h.worker.run_turn()
            assert await other.run_turn()
        ended = [(await h.result(task_id))["status"] for task_id in ids]
        assert ended == ["completed"] * len(ids)
        assert (first.calls, second.calls) == (["film"] * 3, ["noir"] * 3)
        assert first.loads + second.loads == 0
    finally:
        await other.close_engines()
        await h.client.aclose()
        await h.state.db.dispose()


async def test_a_task_of_anothers_adapter_is_taken_once_overdue(
    tmp_path: Path, database_url: str
) -> None:
    """Bounded: a task that has waited its affinity's bound is taken oldest first, whatever
    adapters the worker holds."""
    h, other, (first, _) = await adapter_workers(
        tmp_path, database_url, local_models_affinity_seconds=0.01
    )
    try:
        old = (await h.submit(adapter_body(0, "noir"))).json()["id"]
        await asyncio.sleep(h.worker.affinity.overdue_ms() / 1000 + 0.2)
        await h.submit(adapter_body(1, "film"))
        assert await h.worker.run_turn()
        assert (await h.result(old))["status"] == "completed"
        assert first.calls == ["noir"]
    finally:
        await other.close_engines()
        await h.client.aclose()
        await h.state.db.dispose()
