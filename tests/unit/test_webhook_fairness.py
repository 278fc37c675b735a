"""Admission control and destination health (``genhook.sender.fairness``), on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from genhook.config import Settings
from genhook.sender.fairness import Fairness, destination_of, is_health_failure

A = "https://a.example:443"
B = "https://b.example:443"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, clock: Clock, **overrides: object) -> Fairness[str]:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "webhook_concurrency": 16,
        "webhook_destination_max_in_flight": 2,
        "webhook_account_share": 0.25,
        "webhook_breaker_failures": 3,
        "webhook_breaker_cooldown_seconds": 10.0,
    }
    values.update(overrides)
    return Fairness(Settings(**values), lease_seconds=40.0, ceiling=64, clock=clock)


def lanes(job: str) -> tuple[str, str]:
    destination, account, _ = job.split("|")
    return destination, account


def job(destination: str, account: str, n: int) -> str:
    return f"{destination}|{account}|{n}"


def release(f: Fairness[str], j: str, *, failed: bool = False, seconds: float = 0.01) -> list[str]:
    destination, account = lanes(j)
    return list(
        f.release(
            destination,
            account,
            seconds=seconds,
            failed=failed,
            error="timeout after 10 s" if failed else None,
            now_ms=5_000,
            key=lanes,
        )
    )


def test_destination_of_makes_the_port_explicit() -> None:
    assert destination_of("https://Hooks.Example.com/x?y=1") == "https://hooks.example.com:443"
    assert destination_of("http://10.0.0.1:8080/h") == "http://10.0.0.1:8080"
    assert destination_of("https://[::1]:9/h") == "https://[::1]:9"


def test_health_failures_are_timeouts_connection_errors_and_5xx() -> None:
    assert is_health_failure(None, "timeout after 10 s")
    assert is_health_failure(None, "connection failed: refused")
    assert is_health_failure(503, "HTTP 503")
    assert not is_health_failure(404, "HTTP 404")
    assert not is_health_failure(200, None)
    assert not is_health_failure(None, "target refused: address not allowed")


def test_a_destination_over_its_limit_waits_while_others_flow(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())
    slow = [job(A, "acct_1", n) for n in range(5)]
    assert [f.admit(j, A, "acct_1") for j in slow] == [True, True, False, False, False]
    # Another destination, another account: straight to a sender.
    assert f.admit(job(B, "acct_2", 0), B, "acct_2")
    assert f.parked == 3
    # One slot of A frees after a slow answer: exactly the next of A's line goes.
    assert release(f, slow[0], seconds=2.0) == [slow[2]]
    assert f.parked == 2


def test_a_fast_destination_borrows_idle_senders_but_leaves_a_reserve(tmp_path: Path) -> None:
    f = make(tmp_path, Clock(), webhook_account_share=1.0)  # 16 senders, 12 may be lent
    jobs = [job(A, "acct_1", n) for n in range(20)]
    assert [f.admit(j, A, "acct_1") for j in jobs[:3]] == [True, True, False]
    # Answers in 10 ms: A may go beyond its limit of 2 on idle senders, up to 2 + 12.
    freed = release(f, jobs[0], seconds=0.01)
    assert freed == [jobs[2]]
    for j in jobs[3:]:
        f.admit(j, A, "acct_1")
    in_flight = f.destinations[A].in_flight
    assert in_flight == 2 + 12
    assert f.borrowed[0] == 12
    # A destination that answers slowly never borrows.
    assert f.admit(job(B, "acct_2", 0), B, "acct_2")
    assert f.admit(job(B, "acct_2", 1), B, "acct_2")
    release(f, job(B, "acct_2", 0), seconds=5.0)
    assert f.admit(job(B, "acct_2", 2), B, "acct_2")
    assert not f.admit(job(B, "acct_2", 3), B, "acct_2")


def test_an_account_cannot_take_more_than_its_share(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())  # 16 senders * 0.25 = 4 per account
    destinations = [f"https://h{i}.example:443" for i in range(6)]
    admitted = [f.admit(job(d, "acct_1", 0), d, "acct_1") for d in destinations]
    assert admitted == [True, True, True, True, False, False]
    assert f.admit(job(A, "acct_2", 0), A, "acct_2")
    # acct_1's slot frees: one of its waiting jobs (another destination) goes.
    freed = release(f, job(destinations[0], "acct_1", 0), seconds=2.0)
    assert freed == [job(destinations[4], "acct_1", 0)]


def test_claim_rooms_follow_what_is_held_and_how_fast_a_lane_answers(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())
    for n in range(3):
        f.admit(job(A, "acct_1", n), A, "acct_1")
    rooms = f.rooms()
    # Unknown answer time: the limit plus one round (2 + 2), 3 held.
    assert rooms.destinations[A] == 1
    assert rooms.destination_default == 4
    # A lane that answers in 10 s may hold only its limit and one more round (40 s lease).
    release(f, job(A, "acct_1", 0), seconds=10.0)
    assert f.rooms().destinations[A] == 4 - 2
    # A fast lane may hold up to the ceiling.
    for _ in range(30):
        f.admit(job(B, "acct_2", 9), B, "acct_2")
        release(f, job(B, "acct_2", 9), seconds=0.001)
    assert f.rooms().destinations[B] == 64


def test_circuit_opens_gives_back_held_work_and_probes(tmp_path: Path) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    jobs = [job(A, "acct_1", n) for n in range(4)]
    for j in jobs:
        f.admit(j, A, "acct_1")
    release(f, jobs[0], failed=True)  # the next in line goes out
    release(f, jobs[1], failed=True)
    assert f.state(A) == "closed"
    # The third consecutive failure opens the circuit: the one still waiting is given back.
    assert release(f, jobs[2], failed=True) == []
    assert f.state(A) == "open"
    assert [j for j, _ in f.returned] == []  # jobs[3] was already in flight
    assert f.rooms().destinations[A] == 0
    later = job(A, "acct_1", 9)
    assert not f.admit(later, A, "acct_1")
    assert [j for j, _ in f.returned] == [later]
    assert f.returned[0][1] >= 5_000 + 8_000  # due at the probe (10 s +-20%)
    release(f, jobs[3], failed=True)  # an attempt already in flight ends: still open
    assert f.state(A) == "open"
    # After the cooldown, one half-open probe.
    clock.now += 13
    assert f.rooms().destinations[A] == 1
    assert f.state(A) == "half_open"
    probe = job(A, "acct_1", 10)
    assert f.admit(probe, A, "acct_1")
    assert not f.admit(job(A, "acct_1", 11), A, "acct_1")
    # The probe fails: open again, for longer.
    release(f, probe, failed=True)
    assert f.state(A) == "open"
    clock.now += 13
    assert f.rooms().destinations[A] == 0
    clock.now += 30
    probe = job(A, "acct_1", 12)
    assert f.rooms().destinations[A] == 1
    f.admit(probe, A, "acct_1")
    release(f, probe)
    assert f.state(A) == "closed"
    states = [t.state for t in f.transitions]
    assert states == ["open", "half_open", "open", "half_open", "closed"]


@pytest.mark.parametrize("failures", [1, 2])
def test_a_success_resets_the_failure_count(tmp_path: Path, failures: int) -> None:
    f = make(tmp_path, Clock())
    for n in range(failures):
        f.admit(job(A, "acct_1", n), A, "acct_1")
        release(f, job(A, "acct_1", n), failed=True)
    f.admit(job(A, "acct_1", 7), A, "acct_1")
    release(f, job(A, "acct_1", 7))
    for n in range(2):
        f.admit(job(A, "acct_1", n), A, "acct_1")
        release(f, job(A, "acct_1", n), failed=True)
    assert f.state(A) == "closed"


def test_a_slow_full_destination_has_its_backlog_postponed_once_per_answer_time(
    tmp_path: Path,
) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    jobs = [job(A, "acct_1", n) for n in range(4)]
    for j in jobs:
        f.admit(j, A, "acct_1")
    # Answers take 5 s: A may hold its limit and two rounds more (40 s lease), 6 in all.
    release(f, jobs[0], seconds=5.0)
    for n in range(8, 11):
        f.admit(job(A, "acct_1", n), A, "acct_1")
    rooms = f.rooms()
    assert rooms.destinations[A] == 0
    assert rooms.postpone == {A: 5000}
    assert f.rooms().postpone == {}  # not again before that time
    clock.now += 5
    assert f.rooms().postpone == {A: 5000}
    # A fast or an idle destination is never postponed.
    f.admit(job(B, "acct_2", 0), B, "acct_2")
    release(f, job(B, "acct_2", 0), seconds=0.01)
    assert B not in f.rooms().postpone
