"""A batch's per-picture work runs side by side, in order, in the caller's context."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest

from genhook.engines.local._engine import _each

current = contextvars.ContextVar("current", default="none")


def test_one_item_runs_in_the_calling_thread() -> None:
    assert _each(lambda _: threading.get_ident(), [0]) == [threading.get_ident()]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: one at a time")
def test_items_run_at_once_and_come_back_in_order() -> None:
    count = len(os.sched_getaffinity(0))  # the pool's size: one thread per core
    together = threading.Barrier(count, timeout=10)  # breaks unless all run at once

    def work(item: int) -> tuple[int, str]:
        together.wait()
        return item * 10, current.get()

    token = current.set("the engine run's span")
    try:
        results = _each(work, list(range(count)))
    finally:
        current.reset(token)
    assert results == [(item * 10, "the engine run's span") for item in range(count)]


def test_an_error_reaches_the_caller() -> None:
    def work(item: int) -> int:
        if item == 2:
            raise ValueError("picture 2")
        return item

    with pytest.raises(ValueError, match="picture 2"):
        _each(work, [0, 1, 2, 3])
