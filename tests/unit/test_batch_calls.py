"""``call_batch``: one engine call for a batch's jobs, each job alone when that call fails,
except jobs nobody waits for any more."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence

import pytest

from genhook.engines.base import EngineJob, EngineResult
from genhook.errors import ErrorCode, TaskFailure
from genhook.tasks.worker.batch import call_batch


class _Stopping:
    """A batch engine whose call stops at its jobs' deadline, as a local model's does."""

    def __init__(self) -> None:
        self.alone: list[str] = []

    def load(self) -> None:
        pass

    def batch_key(self, job: EngineJob) -> Hashable:
        return None

    def run(self, job: EngineJob) -> EngineResult:
        self.alone.append(job.task_id)
        return EngineResult([])

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        raise TaskFailure(ErrorCode.TIMEOUT, "the model did not finish by the deadline")


def test_a_batch_stopped_for_its_tasks_is_no_fault_and_never_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tasks past their deadline or given up end so, without running again one by one; a
    call that fails for a task still wanted is logged and run alone."""
    engine = _Stopping()
    late = EngineJob("late", "m", {}, [], deadline=time.time() - 1)
    canceled = EngineJob("canceled", "m", {}, [])
    canceled.stop.set()
    with caplog.at_level(logging.ERROR):
        ended = call_batch(engine, [late, canceled])
    assert engine.alone == [] and caplog.records == []
    assert [(e.code, type(e)) for e in ended] == [  # type: ignore[union-attr]
        (ErrorCode.TIMEOUT, TaskFailure),
        (ErrorCode.ENGINE_ERROR, TaskFailure),
    ]
    wanted = EngineJob("wanted", "m", {}, [])
    with caplog.at_level(logging.ERROR):
        ended = call_batch(engine, [late, wanted])
    assert engine.alone == ["wanted"] and "a batch of 2 failed" in caplog.text
