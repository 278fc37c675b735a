"""Dynamic batching, on SQLite and PostgreSQL: tasks of a batched model share engine calls
(a counting engine records each call's tasks), and each task still ends on its own: its
outputs, usage line, webhook and error; cancels, failures and a raising call stay with
their task; two workers competing for one queue each take whole batches, never a task
twice. Also a synchronous engine running two calls at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from genhook import logs, tracing
from genhook.db import Task, UsageLine, WebhookDelivery, now_ms
from genhook.errors import ErrorCode
from genhook.tasks.worker import Worker
from tests.conftest import ROOT, Harness, make_harness, make_settings
from tests.integration.test_hot_path import submit as submit_edit
from tests.support.engines import (
    BATCH_MODEL,
    COUNTED_LOAD_MODEL,
    PAIRED_MODEL,
    SLOW_LOAD_MODEL,
    CountedLoadEngine,
    CountingBatchEngine,
    SlowLoadEngine,
)
from tests.support.images import data_url
from tests.support.postgres import free_port

HOOK = "http://127.0.0.1:9/hook"


@contextlib.asynccontextmanager
async def batching(
    tmp_path: Path,
    database_url: str,
    size: int = 4,
    wait_ms: int = 0,
    calls: int = 1,
    **overrides: Any,
) -> AsyncIterator[Harness]:
    """A harness whose ``test/batch`` model takes ``size`` tasks a call after a wait of up
    to ``wait_ms``, ``calls`` calls at once; the engine's recorded calls start empty."""
    tuning = {"max_batch_size": size, "max_wait_ms": wait_ms, "concurrency": calls}
    settings = make_settings(
        tmp_path,
        database_url,
        extra_engines=["tests.support.engines:register_batching"],
        model_batching={BATCH_MODEL: tuning, **overrides.pop("model_batching", {})},
        **overrides,
    )
    harness = await make_harness(settings)
    CountingBatchEngine.calls.clear()
    try:
        yield harness
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()


@pytest.fixture
async def h(tmp_path: Path, database_url: str) -> AsyncIterator[Harness]:
    async with batching(tmp_path, database_url) as harness:
        yield harness


async def submit(h: Harness, prompt: str = "edit", **fields: Any) -> str:
    return await submit_edit(h, prompt, **({"model": BATCH_MODEL} | fields))


async def rows(h: Harness, ids: Sequence[str]) -> dict[str, Task]:
    async with h.state.db.read() as session:
        found = await session.scalars(select(Task).where(Task.id.in_(ids)))
        return {task.id: task for task in found}


async def usage_of(h: Harness, ids: Sequence[str]) -> int:
    async with h.state.db.read() as session:
        count = await session.scalar(select(func.count()).where(UsageLine.task_id.in_(ids)))
        return int(count or 0)


async def callbacks(h: Harness) -> dict[str, list[dict[str, Any]]]:
    """Terminal callback bodies by task."""
    async with h.state.db.read() as session:
        found = await session.execute(
            select(WebhookDelivery.task_id, WebhookDelivery.body).where(
                WebhookDelivery.event_type.not_like("%.task.processing")
            )
        )
        bodies: dict[str, list[dict[str, Any]]] = {}
        for task_id, body in found:
            bodies.setdefault(task_id, []).append(json.loads(body))
        return bodies


def outputs_of(body: dict[str, Any]) -> list[str]:
    outputs: list[str] = body["payload"]["outputs"]
    return outputs


async def until_called() -> None:
    """Until the batch engine's first call has begun."""
    async with asyncio.timeout(30):
        while not CountingBatchEngine.calls:
            await asyncio.sleep(0.01)


async def until_processing(h: Harness, ids: Sequence[str]) -> None:
    async with asyncio.timeout(30):
        while {task.status for task in (await rows(h, ids)).values()} != {"processing"}:
            await asyncio.sleep(0.01)


async def test_tasks_submitted_together_share_calls_each_ending_alone(h: Harness) -> None:
    ids = [await submit(h, webhook_url=HOOK) for _ in range(10)]
    assert await h.run_all() == math.ceil(10 / 4)
    # Oldest first, four to a call: ceil(10 / 4) calls.
    assert CountingBatchEngine.calls == [tuple(ids[0:4]), tuple(ids[4:8]), tuple(ids[8:10])]
    tasks = await rows(h, ids)
    assert {task.status for task in tasks.values()} == {"completed"}
    for index, task_id in enumerate(ids):
        assert tasks[task_id].info["batch_size"] == (2 if index >= 8 else 4)
        assert len(tasks[task_id].outputs) == 1
    assert len({key for task in tasks.values() for key in task.outputs}) == 10
    assert await usage_of(h, ids) == 10
    bodies = await callbacks(h)
    for task_id in ids:
        (body,) = bodies[task_id]  # one callback each, with only its own output
        assert body["session_id"] == task_id and body["payload"]["info"]["batch_size"] == 4 - 2 * (
            task_id in ids[8:]
        )
        (url,) = outputs_of(body)
        assert url.endswith(tasks[task_id].outputs[0])
        result = await h.result(task_id)
        assert result["status"] == "completed" and result["info"]["batch_size"] in (2, 4)


async def test_tasks_of_different_batch_keys_never_share_a_call(h: Harness) -> None:
    sizes = ["1024*1024", "1536*1536", "1024*1024", "1536*1536"]
    ids = [await submit(h, size=size) for size in sizes]
    await h.run_all()
    # One claim took all four; one call per output size, the oldest task's key first.
    assert CountingBatchEngine.calls == [(ids[0], ids[2]), (ids[1], ids[3])]
    tasks = await rows(h, ids)
    assert {task.status for task in tasks.values()} == {"completed"}
    assert {task.info["batch_size"] for task in tasks.values()} == {2}


async def test_a_failing_entry_fails_its_task_alone(h: Harness) -> None:
    ids = [await submit(h), await submit(h, "fail", webhook_url=HOOK), await submit(h)]
    await h.run_all()
    assert CountingBatchEngine.calls == [tuple(ids)]
    tasks = await rows(h, ids)
    assert [tasks[i].status for i in ids] == ["completed", "failed", "completed"]
    assert tasks[ids[1]].error_code == int(ErrorCode.INSTRUCTION_INVALID)
    assert tasks[ids[1]].outputs == []
    assert await usage_of(h, ids) == 2
    (body,) = (await callbacks(h))[ids[1]]
    assert body["payload"]["status"] == "failed" and body["session_id"] == ids[1]


async def test_a_raising_call_runs_each_task_alone(h: Harness) -> None:
    ids = [await submit(h), await submit(h, "crash"), await submit(h)]
    await h.run_all()
    # The batch call raised; then each task once alone.
    assert CountingBatchEngine.calls == [tuple(ids), (ids[0],), (ids[1],), (ids[2],)]
    tasks = await rows(h, ids)
    assert [tasks[i].status for i in ids] == ["completed", "failed", "completed"]
    assert tasks[ids[1]].error_code == int(ErrorCode.ENGINE_ERROR)
    assert await usage_of(h, ids) == 2


async def test_a_lone_task_runs_after_the_wait(tmp_path: Path, database_url: str) -> None:
    async with batching(tmp_path, database_url, wait_ms=300) as h:
        task_id = await submit(h)
        async with asyncio.timeout(30):  # the wait ends by itself: no other task comes
            assert await h.worker.run_turn()
        assert CountingBatchEngine.calls == [(task_id,)]
        assert (await rows(h, [task_id]))[task_id].info["batch_size"] == 1


async def cancel(h: Harness, task_id: str) -> None:
    answer = await h.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=h.headers)
    assert answer.status_code == 200, answer.text


async def test_a_task_canceled_while_its_batch_forms_leaves_it(
    tmp_path: Path, database_url: str
) -> None:
    async with batching(tmp_path, database_url, wait_ms=1500) as h:
        kept, canceled = await submit(h), await submit(h)
        running = asyncio.create_task(h.worker.run_turn())
        await until_processing(h, [kept, canceled])  # both claimed; the batch waits for more
        await cancel(h, canceled)
        async with asyncio.timeout(30):
            assert await running
        assert CountingBatchEngine.calls == [(kept,)]
        tasks = await rows(h, [kept, canceled])
        assert tasks[kept].status == "completed" and tasks[kept].info["batch_size"] == 1
        assert tasks[canceled].status == "canceled" and tasks[canceled].outputs == []
        assert await usage_of(h, [kept, canceled]) == 1


async def test_a_task_canceled_in_a_running_batch_is_discarded_alone(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genhook")
    async with batching(tmp_path, database_url, cancel_check_seconds=0.05) as h:
        # The second job waits until it is given up; the others finish normally.
        ids = [await submit(h), await submit(h, "wait=20"), await submit(h)]
        running = asyncio.create_task(h.worker.run_turn())
        await until_called()
        await cancel(h, ids[1])
        async with asyncio.timeout(30):
            assert await running
        assert CountingBatchEngine.calls == [tuple(ids)]
        tasks = await rows(h, ids)
        assert [tasks[i].status for i in ids] == ["completed", "canceled", "completed"]
        assert tasks[ids[1]].outputs == []
        assert {tasks[ids[0]].info["batch_size"], tasks[ids[2]].info["batch_size"]} == {3}
        assert await usage_of(h, ids) == 2
        assert not h.worker.tainted  # the engine call ended; the worker claims on
        said = [(r.levelno, r.getMessage()) for r in caplog.records if ids[1] in r.getMessage()]
        line = f"task {ids[1]}: canceled by its owner; it leaves its batch's call"
        assert said == [(logging.INFO, line)], said


@contextlib.asynccontextmanager
async def working(*workers: Worker) -> AsyncIterator[None]:
    """The workers' loops running until the block ends."""
    stop = asyncio.Event()
    running = [asyncio.create_task(worker.run(stop)) for worker in workers]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*running)


async def until_ended(h: Harness, ids: Sequence[str]) -> dict[str, Task]:
    async with asyncio.timeout(60):
        while True:
            tasks = await rows(h, ids)
            if all(task.finished_at is not None for task in tasks.values()):
                return tasks
            await asyncio.sleep(0.02)


async def test_two_workers_competing_take_each_task_once(tmp_path: Path, database_url: str) -> None:
    async with batching(tmp_path, database_url, wait_ms=20) as h:
        workers = [Worker.sharing(h.state, worker_id=f"w-{name}") for name in "ab"]
        async with working(*workers):
            ids = [await submit(h, webhook_url=HOOK) for _ in range(14)]
            tasks = await until_ended(h, ids)
        assert {task.status for task in tasks.values()} == {"completed"}
        ran = [task_id for call in CountingBatchEngine.calls for task_id in call]
        assert sorted(ran) == sorted(ids)  # every task in exactly one call
        assert all(1 <= len(call) <= 4 for call in CountingBatchEngine.calls)
        assert len(CountingBatchEngine.calls) >= math.ceil(14 / 4)
        assert await usage_of(h, ids) == 14
        bodies = await callbacks(h)
        assert all(len(bodies[task_id]) == 1 for task_id in ids)


async def test_a_synchronous_engine_runs_two_calls_at_once(
    tmp_path: Path, database_url: str
) -> None:
    async with batching(tmp_path, database_url) as h, working(h.worker):
        body = {"model": PAIRED_MODEL, "prompt": "p", "images": [data_url()], "size": "1024*1024"}
        ids = [(await h.submit(body)).json()["id"] for _ in range(2)]
        tasks = await until_ended(h, ids)
        # Each run waits for the other at a barrier: they ran at the same time.
        assert {task.status for task in tasks.values()} == {"completed"}


async def test_a_batched_model_runs_two_batches_at_once(tmp_path: Path, database_url: str) -> None:
    async with batching(tmp_path, database_url, size=2, calls=2) as h:
        ids = [await submit(h, webhook_url=HOOK) for _ in range(6)]
        async with working(h.worker):
            tasks = await until_ended(h, ids)
        assert {task.status for task in tasks.values()} == {"completed"}
        ran = [task_id for call in CountingBatchEngine.calls for task_id in call]
        assert sorted(ran) == sorted(ids)
        assert [len(call) for call in CountingBatchEngine.calls] == [2, 2, 2]
        assert {task.info["batch_size"] for task in tasks.values()} == {2}
        assert await usage_of(h, ids) == 6


async def test_a_stop_starts_no_new_call_of_the_batch(tmp_path: Path, database_url: str) -> None:
    """Told to stop while a batch's first call runs, the worker lets that call finish within
    the grace and starts none of the others: their tasks go back to the queue."""
    async with batching(tmp_path, database_url, shutdown_grace_seconds=0.5) as h:
        first = await submit(h, "wait=30", size="1024*1024")
        second = await submit(h, "edit", size="1536*1536")
        stop = asyncio.Event()
        running = asyncio.create_task(h.worker.run(stop))
        await until_called()
        stop.set()
        async with asyncio.timeout(30):
            await running
        assert CountingBatchEngine.calls == [(first,)]
        tasks = await rows(h, [first, second])
        assert [tasks[first].status, tasks[second].status] == ["created", "created"]


async def test_a_call_abandoned_by_all_its_tasks_lets_no_other_call_start_beside_it(
    tmp_path: Path, database_url: str
) -> None:
    """A call that cannot stop taints the worker: the batch's next key does not run beside
    it in the same engine (a pipeline is not thread-safe); its task goes back."""
    async with batching(tmp_path, database_url, cancel_check_seconds=0.05) as h:
        stuck = await submit(h, "sleep=3", size="1024*1024")
        other = await submit(h, "edit", size="1536*1536")
        running = asyncio.create_task(h.worker.run_turn())
        await until_called()
        await cancel(h, stuck)
        async with asyncio.timeout(30):
            await running
        assert h.worker.tainted and CountingBatchEngine.calls == [(stuck,)]
        assert (await rows(h, [other]))[other].status == "created"
        await asyncio.sleep(3)  # the abandoned call ends before the test does


@contextlib.asynccontextmanager
async def loading(h: Harness) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    """``h``'s worker running (its stop and its run), once the slow model's load has begun;
    the load lasts until the test sets ``SlowLoadEngine.loaded``, or the end."""
    SlowLoadEngine.reset()
    stop = asyncio.Event()
    running = asyncio.create_task(h.worker.run(stop))
    try:
        async with asyncio.timeout(30):
            while not SlowLoadEngine.loads:
                await asyncio.sleep(0.01)
        yield stop, running
    finally:
        SlowLoadEngine.loaded.set()
        stop.set()
        async with asyncio.timeout(30):
            await running


async def until_status(h: Harness, task_id: str, status: str) -> None:
    async with asyncio.timeout(30):
        while (await rows(h, [task_id]))[task_id].status != status:
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("size", [1, 4])
async def test_a_stop_while_the_model_loads_gives_the_tasks_back_at_the_grace(
    size: int, tmp_path: Path, database_url: str
) -> None:
    """Alone or batched, a task whose model is still loading when the grace ends goes back
    to the queue; the load goes on in its thread, and the worker says so."""
    settings = {"model_batching": {SLOW_LOAD_MODEL: {"max_batch_size": size}}}
    async with batching(tmp_path, database_url, shutdown_grace_seconds=0.3, **settings) as h:
        ids = [await submit(h, model=SLOW_LOAD_MODEL) for _ in range(2)]
        async with loading(h) as (stop, running):
            stop.set()
            async with asyncio.timeout(30):
                await running
            assert h.worker.loading and not SlowLoadEngine.loaded.is_set()
            assert {task.status for task in (await rows(h, ids)).values()} == {"created"}


@pytest.mark.parametrize("size", [1, 4])
async def test_a_load_that_ends_within_the_grace_lets_the_task_in_hand_finish(
    size: int, tmp_path: Path, database_url: str
) -> None:
    """Alone or batched, the tasks in hand when the stop comes run once their model has
    loaded within the grace, and the worker then leaves."""
    settings = {"model_batching": {SLOW_LOAD_MODEL: {"max_batch_size": size}}}
    async with batching(tmp_path, database_url, shutdown_grace_seconds=30, **settings) as h:
        ids = [await submit(h, model=SLOW_LOAD_MODEL) for _ in range(size)]
        async with loading(h) as (stop, running):
            stop.set()
            await asyncio.sleep(0.3)
            SlowLoadEngine.loaded.set()
            async with asyncio.timeout(30):
                await running
        assert {task.status for task in (await rows(h, ids)).values()} == {"completed"}


async def test_a_task_canceled_while_its_model_loads_leaves_one_load_for_the_next(
    tmp_path: Path, database_url: str
) -> None:
    settings = {"model_batching": {SLOW_LOAD_MODEL: {"max_batch_size": 1}}}
    async with batching(tmp_path, database_url, cancel_check_seconds=0.05, **settings) as h:
        first = await submit(h, model=SLOW_LOAD_MODEL)
        second = await submit(h, model=SLOW_LOAD_MODEL)
        async with loading(h):
            await cancel(h, first)
            await until_status(h, second, "processing")
            await asyncio.sleep(0.3)  # the second task waits for the load under way
            SlowLoadEngine.loaded.set()
            await until_status(h, second, "completed")
        assert (SlowLoadEngine.loads, SlowLoadEngine.most) == (1, 1)


async def test_a_load_waiting_its_turn_for_a_task_given_up_never_starts(
    tmp_path: Path, database_url: str
) -> None:
    """A task canceled while its model's load waits for another model's load to end leaves
    nothing to load: that load does not start, and takes no memory from the next task's."""
    tuning = {SLOW_LOAD_MODEL: {"max_batch_size": 1}}
    async with batching(
        tmp_path, database_url, model_batching=tuning, cancel_check_seconds=0.05
    ) as h:
        CountedLoadEngine.loads = 0
        first = await submit(h, model=SLOW_LOAD_MODEL)
        second = await submit(h, model=COUNTED_LOAD_MODEL)
        async with loading(h):
            await cancel(h, first)
            await until_status(h, second, "processing")
            await asyncio.sleep(0.2)  # its load waits for the first one's to end
            await cancel(h, second)
            await asyncio.sleep(0.3)
            SlowLoadEngine.loaded.set()
            async with asyncio.timeout(30):
                while h.worker.loading:
                    await asyncio.sleep(0.02)
        assert CountedLoadEngine.loads == 0


async def test_a_database_fault_at_a_deadline_in_a_batch_spares_the_neighbours(
    tmp_path: Path, database_url: str
) -> None:
    """The timeout of one task of a running batch is retried through a database fault; its
    neighbour's call goes on and completes."""
    async with batching(tmp_path, database_url) as h:
        late = await submit(h, "wait=30")
        kept = await submit(h, "sleep=1")
        lifecycle = h.worker.lifecycle
        claim, time_out = lifecycle.claim, lifecycle.time_out
        faults: list[None] = []

        async def claim_with_a_near_deadline(*args: Any, **kwargs: Any) -> Any:
            claimed = await claim(*args, **kwargs)
            for task in claimed.tasks:
                if task.id == late:
                    task.deadline_at = now_ms() + 300
            return claimed

        async def faulty_time_out(*args: Any, **kwargs: Any) -> Any:
            if not faults:
                faults.append(None)
                raise OperationalError("UPDATE tasks", {}, Exception("database is locked"))
            return await time_out(*args, **kwargs)

        lifecycle.claim = claim_with_a_near_deadline  # type: ignore[method-assign]
        lifecycle.time_out = faulty_time_out  # type: ignore[method-assign]
        await h.worker.run_turn()
        tasks = await rows(h, [late, kept])
        assert faults and (tasks[late].status, tasks[kept].status) == ("timeout", "completed")
        assert await usage_of(h, [kept]) == 1


async def test_a_worker_stopped_while_a_model_loads_leaves_without_waiting_for_it(
    tmp_path: Path, database_url: str
) -> None:
    """``genhook worker`` told to stop while its model loads (for a minute here) gives its
    task back at the grace and exits 0 at once, rather than join the loading thread."""
    tuning = {SLOW_LOAD_MODEL: {"max_batch_size": 1}}
    async with batching(tmp_path, database_url, model_batching=tuning) as h:
        task_id = await submit(h, model=SLOW_LOAD_MODEL)
        settings = h.state.settings
        environment = {
            **os.environ,
            "GENHOOK_DATA_DIR": str(settings.data_dir),
            "GENHOOK_DATABASE_URL": settings.database_url or "",
            "GENHOOK_EXTRA_ENGINES": json.dumps(settings.extra_engines),
            "GENHOOK_MODEL_BATCHING": json.dumps(tuning),
            "GENHOOK_SHUTDOWN_GRACE_SECONDS": "0.3",
            "GENHOOK_HEALTH_PORT": str(free_port()),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "genhook.cli", "worker"],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            async with asyncio.timeout(60):
                while (await rows(h, [task_id]))[task_id].status != "processing":
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # inside the load
            worker.send_signal(signal.SIGTERM)
            output, _ = await asyncio.to_thread(worker.communicate, timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert worker.returncode == 0, output
        assert "leaving with a model load unfinished" in output, output
        assert (await rows(h, [task_id]))[task_id].status == "created"


async def test_every_task_is_traced_and_tagged_in_a_batch_and_alone(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each task of a batch has its own ``genhook.task.run`` span, linked with the one span
    of the call it shared, as a lone task has; every log line about a task carries its id."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("genhook-test"))
    caplog.set_level(logging.DEBUG, logger="genhook")
    caplog.handler.addFilter(logs._ContextFilter("worker"))
    batched = [await submit(h), await submit(h, "fail"), await submit(h), await submit(h)]
    assert await h.worker.run_turn()
    alone = await submit(h, model=COUNTED_LOAD_MODEL)
    assert await h.worker.run_turn()
    assert CountingBatchEngine.calls[0] == tuple(batched)
    spans = exporter.get_finished_spans()
    runs = {
        span.attributes["genhook.task.id"]: span
        for span in spans
        if span.name == "genhook.task.run" and span.attributes
    }
    assert set(runs) == {*batched, alone}
    (shared,) = [
        span
        for span in spans
        if span.name == "genhook.engine.run"
        and span.attributes
        and "genhook.batch.size" in span.attributes
    ]
    assert shared.context is not None
    for task_id in batched:
        assert [link.context.span_id for link in runs[task_id].links] == [shared.context.span_id]
    linked = {link.context.span_id for link in shared.links}
    assert linked == {runs[task_id].context.span_id for task_id in batched}  # type: ignore[union-attr]
    # The lone task's engine span nests in its own run span.
    nested = [
        span
        for span in spans
        if span.name == "genhook.engine.run"
        and span.parent is not None
        and span.parent.span_id == runs[alone].context.span_id  # type: ignore[union-attr]
    ]
    assert len(nested) == 1
    ids = {*batched, alone}
    about = [record for record in caplog.records if any(i in record.getMessage() for i in ids)]
    assert any("failed" in record.getMessage() for record in about), caplog.text
    for record in about:
        assert getattr(record, "task_id", None) in record.getMessage(), record.getMessage()
