"""Dedup stores: first_time is True exactly once per session_id, across threads and processes."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from genhook.receiver import DedupStore, MemoryDedupStore, SQLiteDedupStore


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> DedupStore:
    if request.param == "memory":
        return MemoryDedupStore()
    return SQLiteDedupStore(tmp_path / "seen.db")


def test_first_time_once_then_forget(store: DedupStore):
    assert isinstance(store, DedupStore)
    assert store.first_time("t1") is True
    assert store.first_time("t1") is False
    assert store.first_time("t2") is True
    store.forget("t1")
    assert store.first_time("t1") is True
    assert store.first_time("t1") is False


def test_concurrent_threads_have_one_winner(store: DedupStore):
    wins: list[bool] = []
    barrier = threading.Barrier(8)

    def claim() -> None:
        barrier.wait()
        wins.append(store.first_time("race"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]


def test_memory_store_is_bounded():
    store = MemoryDedupStore(max_entries=2)
    for sid in ("a", "b", "c"):
        assert store.first_time(sid)
    assert store.first_time("a") is True  # evicted, oldest first
    assert store.first_time("c") is False


def test_sqlite_store_survives_reopen_and_prunes(tmp_path: Path):
    path = tmp_path / "seen.db"
    first = SQLiteDedupStore(path)
    assert first.first_time("t1")
    first.close()
    again = SQLiteDedupStore(path)
    assert again.first_time("t1") is False
    assert again.prune(older_than_seconds=3600) == 0
    assert again.prune(older_than_seconds=-1) == 1
    assert again.first_time("t1") is True


def _claim(path: str, sid: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put(SQLiteDedupStore(path).first_time(sid))


def test_sqlite_store_has_one_winner_across_processes(tmp_path: Path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    path = str(tmp_path / "seen.db")
    SQLiteDedupStore(path).close()  # create the schema once up front
    procs = [ctx.Process(target=_claim, args=(path, "shared", out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [False, False, True]
