"""Admission control and endpoint and host health (``genhook.sender.fairness``), on a fake
clock. Jobs are ``host|account|n``, sent to ``host/hook`` unless a path is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from genhook.config import Settings
from genhook.sender.fairness import (
    Fairness,
    Rooms,
    Route,
    destination_of,
    endpoint_of,
    failure_scope,
    is_health_failure,
)

A = "https://a.example:443"
B = "https://b.example:443"
LANE_A = f"acct_1 {A}/hook"
LANE_B = f"acct_2 {B}/hook"


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


def lanes(job: str) -> Route:
    host, account, n = job.split("|")
    path = n.split("/", 1)[1] if "/" in n else "hook"
    return Route(account, f"{host}/{path}", host)


def job(destination: str, account: str, n: int | str) -> str:
    return f"{destination}|{account}|{n}"


def admit(f: Fairness[str], j: str) -> bool:
    return f.admit(j, lanes(j))


def release(
    f: Fairness[str],
    j: str,
    *,
    failed: bool = False,
    seconds: float = 0.01,
    status: int | None = None,
    error: str | None = None,
    retry_after: float | None = None,
) -> list[str]:
    if failed and error is None and status is None:
        error = "timeout after 10 s"
    return list(
        f.release(
            lanes(j),
            seconds=seconds,
            status_code=status,
            error=error,
            now_ms=5_000,
            key=lanes,
            retry_after=retry_after,
        )
    )


def room(rooms: Rooms, key: str) -> int:
    return rooms.destinations.get(key, rooms.destination_default)


def lane(j: str) -> str:
    return lanes(j).lane


def test_destination_of_makes_the_port_explicit() -> None:
    assert destination_of("https://Hooks.Example.com/x?y=1") == "https://hooks.example.com:443"
    assert destination_of("http://10.0.0.1:8080/h") == "http://10.0.0.1:8080"
    assert destination_of("https://[::1]:9/h") == "https://[::1]:9"


def test_an_endpoint_is_the_url_without_its_query() -> None:
    assert (
        endpoint_of("https://Hooks.Example.com/x/y?token=1#f")
        == "https://hooks.example.com:443/x/y"
    )
    assert endpoint_of("http://10.0.0.1:8080") == "http://10.0.0.1:8080/"
    assert endpoint_of("http://h/a") != endpoint_of("http://h/b")


def test_health_failures_are_timeouts_connection_errors_5xx_and_429() -> None:
    assert is_health_failure(None, "timeout after 10 s")
    assert is_health_failure(None, "connection failed: refused")
    assert is_health_failure(503, "HTTP 503")
    assert is_health_failure(429, "HTTP 429")
    assert not is_health_failure(404, "HTTP 404")
    assert not is_health_failure(410, "HTTP 410")
    assert not is_health_failure(200, None)
    assert not is_health_failure(None, "target refused: address not allowed")
    # Connection-level failures are the host's; answers and timeouts the endpoint's.
    assert failure_scope(None, "connection failed: [Errno 111] refused") == "host"
    assert failure_scope(None, "TLS certificate verification failed") == "host"
    assert failure_scope(None, "timeout after 10 s") == "endpoint"
    assert failure_scope(None, "ServerDisconnectedError: reset") == "endpoint"
    assert failure_scope(500, "HTTP 500") == "endpoint"


def test_a_destination_over_its_limit_waits_while_others_flow(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())
    slow = [job(A, "acct_1", n) for n in range(5)]
    assert [admit(f, j) for j in slow] == [True, True, False, False, False]
    # Another destination, another account: straight to a sender.
    assert admit(f, job(B, "acct_2", 0))
    assert f.parked == 3
    # One slot of A frees after a slow answer: exactly the next of A's line goes.
    assert release(f, slow[0], seconds=2.0) == [slow[2]]
    assert f.parked == 2


def test_a_fast_destination_borrows_idle_senders_but_leaves_a_reserve(tmp_path: Path) -> None:
    f = make(tmp_path, Clock(), webhook_account_share=1.0)  # 16 senders, 12 may be lent
    jobs = [job(A, "acct_1", n) for n in range(20)]
    assert [admit(f, j) for j in jobs[:3]] == [True, True, False]
    # Answers in 10 ms: A may go beyond its limit of 2 on idle senders, up to 2 + 12.
    freed = release(f, jobs[0], seconds=0.01)
    assert freed == [jobs[2]]
    for j in jobs[3:]:
        admit(f, j)
    in_flight = f.destinations[lane(jobs[0])].in_flight
    assert in_flight == 2 + 12
    assert f.borrowed[0] == 12
    # A destination that answers slowly never borrows.
    assert admit(f, job(B, "acct_2", 0))
    assert admit(f, job(B, "acct_2", 1))
    release(f, job(B, "acct_2", 0), seconds=5.0)
    assert admit(f, job(B, "acct_2", 2))
    assert not admit(f, job(B, "acct_2", 3))


def test_an_account_cannot_take_more_than_its_share(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())  # 16 senders * 0.25 = 4 per account
    destinations = [f"https://h{i}.example:443" for i in range(6)]
    admitted = [admit(f, job(d, "acct_1", 0)) for d in destinations]
    assert admitted == [True, True, True, True, False, False]
    assert admit(f, job(A, "acct_2", 0))
    # acct_1's slot frees: one of its waiting jobs (another destination) goes.
    freed = release(f, job(destinations[0], "acct_1", 0), seconds=2.0)
    assert freed == [job(destinations[4], "acct_1", 0)]


def test_claim_rooms_follow_what_is_held_and_how_fast_a_lane_answers(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())
    for n in range(3):
        admit(f, job(A, "acct_1", n))
    rooms = f.rooms()
    # Unknown answer time: the limit plus one round (2 + 2), 3 held.
    assert room(rooms, LANE_A) == 1
    # A lane never seen is claimed one delivery at a time: its first attempt.
    assert rooms.destination_default == 1
    # A lane that answers in 10 s may hold only its limit and one more round (40 s lease).
    release(f, job(A, "acct_1", 0), seconds=10.0)
    assert room(f.rooms(), LANE_A) == 4 - 2
    # A fast lane may hold up to the ceiling.
    for _ in range(30):
        admit(f, job(B, "acct_2", 9))
        release(f, job(B, "acct_2", 9), seconds=0.001)
    assert room(f.rooms(), LANE_B) == 64


def test_circuit_opens_gives_back_held_work_and_probes(tmp_path: Path) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    jobs = [job(A, "acct_1", n) for n in range(4)]
    for j in jobs:
        admit(f, j)
    release(f, jobs[0], failed=True)  # the next in line goes out
    release(f, jobs[1], failed=True)
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "closed"
    # The third consecutive failure opens the circuit: the one still waiting is given back.
    assert release(f, jobs[2], failed=True) == []
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "open"
    assert [j for j, _ in f.returned] == []  # jobs[3] was already in flight
    assert room(f.rooms(), LANE_A) == 0
    later = job(A, "acct_1", 9)
    assert not admit(f, later)
    assert [j for j, _ in f.returned] == [later]
    assert f.returned[0][1] >= 5_000 + 8_000  # due at the probe (10 s +-20%)
    release(f, jobs[3], failed=True)  # an attempt already in flight ends: still open
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "open"
    # After the cooldown, one half-open probe.
    clock.now += 13
    assert room(f.rooms(), LANE_A) == 1
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "half_open"
    probe = job(A, "acct_1", 10)
    assert admit(f, probe)
    assert not admit(f, job(A, "acct_1", 11))
    # The probe fails: open again, for longer.
    release(f, probe, failed=True)
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "open"
    clock.now += 13
    assert room(f.rooms(), LANE_A) == 0
    clock.now += 30
    probe = job(A, "acct_1", 12)
    assert room(f.rooms(), LANE_A) == 1
    admit(f, probe)
    release(f, probe)
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "closed"
    states = [t.state for t in f.transitions]
    assert states == ["open", "half_open", "open", "half_open", "closed"]


@pytest.mark.parametrize("failures", [1, 2])
def test_a_success_resets_the_failure_count(tmp_path: Path, failures: int) -> None:
    f = make(tmp_path, Clock())
    for n in range(failures):
        admit(f, job(A, "acct_1", n))
        release(f, job(A, "acct_1", n), failed=True)
    admit(f, job(A, "acct_1", 7))
    release(f, job(A, "acct_1", 7))
    for n in range(2):
        admit(f, job(A, "acct_1", n))
        release(f, job(A, "acct_1", n), failed=True)
    assert f.state(lanes(job(A, "acct_1", 0)))[0] == "closed"


def test_a_slow_full_destination_has_its_backlog_postponed_once_per_answer_time(
    tmp_path: Path,
) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    jobs = [job(A, "acct_1", n) for n in range(4)]
    for j in jobs:
        admit(f, j)
    # Answers take 5 s: A may hold its limit and two rounds more (40 s lease), 6 in all.
    release(f, jobs[0], seconds=5.0)
    for n in range(8, 11):
        admit(f, job(A, "acct_1", n))
    rooms = f.rooms()
    assert room(rooms, LANE_A) == 0
    assert rooms.postpone == {LANE_A: 5000}
    assert f.rooms().postpone == {}  # not again before that time
    clock.now += 5
    assert f.rooms().postpone == {LANE_A: 5000}
    # A fast or an idle destination is never postponed.
    admit(f, job(B, "acct_2", 0))
    release(f, job(B, "acct_2", 0), seconds=0.01)
    assert LANE_B not in f.rooms().postpone


def test_hung_paths_of_a_host_leave_room_for_a_healthy_path_of_the_same_account(
    tmp_path: Path,
) -> None:
    # 128 senders: 64 for the account, 16 of them kept for trusted and new endpoints.
    f = make(tmp_path, Clock(), webhook_concurrency=128, webhook_account_share=0.5)
    f.destination_limit = 8
    hung = [job(A, "acct_1", f"{n}/p{i}") for i in range(50) for n in range(20)]
    for j in hung:
        admit(f, j)
    account = f.accounts["acct_1"]
    # The first path has its limit; every other path of the host, not having answered,
    # one attempt at a time: 8 + 49, within the share.
    assert account.in_flight == 57
    assert f.destinations[lane(hung[0])].in_flight == 8
    assert f.destinations[lane(hung[20])].in_flight == 1
    # A path never seen goes at once, and once it has answered fast it keeps flowing.
    healthy = [job(A, "acct_1", f"{n}/good") for n in range(30)]
    for j in healthy:
        assert admit(f, j)
        assert release(f, j, seconds=0.002) == []
    # The hung paths time out: they may take the share but for the reserve.
    waiting = {j for key in f.lines for j in f.destinations[key].waiting}
    for j in [j for j in hung if j not in waiting]:
        release(f, j, failed=True, seconds=10.0)
    assert account.untrusted <= 64 - 16
    for j in healthy:
        assert admit(f, j)
        release(f, j, seconds=0.002)
    # The claim keeps room for the trusted path too, and none for the hung ones.
    rooms = f.rooms()
    assert rooms.accounts["acct_1"] >= 16
    assert room(rooms, lane(hung[40])) == 0
    assert room(rooms, lane(healthy[0])) > 0


def test_one_accounts_failures_take_nothing_of_another_account(tmp_path: Path) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    bad = [job(A, "acct_1", n) for n in range(3)]
    for j in bad:
        admit(f, j)
        release(f, j, status=500, error="HTTP 500")
    assert f.state(lanes(bad[0])) == ("open", "closed")
    # The same endpoint for another account: its own circuit, its own slots.
    other = [job(A, "acct_2", n) for n in range(2)]
    assert [admit(f, j) for j in other] == [True, True]
    assert f.state(lanes(other[0])) == ("closed", "closed")
    assert room(f.rooms(), lanes(other[0]).lane) > 0
    # The probe after the cooldown is acct_1's alone; acct_2 was never held back.
    clock.now += 13
    rooms = f.rooms()
    assert room(rooms, lanes(bad[0]).lane) == 1
    assert f.state(lanes(other[0])) == ("closed", "closed")
    assert {t.account for t in f.transitions} == {"acct_1"}


def test_connection_failures_open_the_hosts_circuit_of_that_account(tmp_path: Path) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    x = [job(A, "acct_1", f"{n}/x") for n in range(3)]
    for j in x:
        admit(f, j)
        release(f, j, error="connection failed: [Errno 111] Connection refused")
    assert f.state(lanes(x[0])) == ("closed", "open")
    # Another endpoint of that host waits for the host's probe; another account does not.
    y = job(A, "acct_1", "0/y")
    assert not admit(f, y)
    assert [j for j, _ in f.returned] == [y]
    assert admit(f, job(A, "acct_2", "0/y"))
    assert f.rooms().destinations[lanes(y).lane] == 0
    # Half-open: one probe for the whole host.
    clock.now += 13
    probe = job(A, "acct_1", "5/x")
    assert admit(f, probe)
    assert not admit(f, job(A, "acct_1", "1/y"))
    assert release(f, probe, status=200) == []
    assert f.state(lanes(x[0])) == ("closed", "closed")
    assert admit(f, job(A, "acct_1", "2/y"))
    assert [(t.scope, t.state) for t in f.transitions] == [
        ("host", "open"),
        ("host", "half_open"),
        ("host", "closed"),
    ]


def test_429_with_retry_after_holds_the_endpoint_until_then(tmp_path: Path) -> None:
    clock = Clock()
    f = make(tmp_path, clock, webhook_destination_max_in_flight=1)
    jobs = [job(A, "acct_1", n) for n in range(3)]
    assert [admit(f, j) for j in jobs] == [True, False, False]
    release(f, jobs[0], status=429, error="HTTP 429", retry_after=30.0)
    assert f.state(lanes(jobs[0]))[0] == "open"
    # The waiting ones go back, due when the receiver said.
    assert [(j, due) for j, due in f.returned] == [(jobs[1], 35_000), (jobs[2], 35_000)]
    assert f.transitions[-1].retry_at == 35_000
    clock.now += 29
    assert room(f.rooms(), LANE_A) == 0
    clock.now += 2
    assert room(f.rooms(), LANE_A) == 1


def test_410_gone_stops_the_endpoints_pending_deliveries(tmp_path: Path) -> None:
    f = make(tmp_path, Clock())
    jobs = [job(A, "acct_1", n) for n in range(4)]
    for j in jobs:
        admit(f, j)
    release(f, jobs[0], status=410, error="HTTP 410")
    [stop] = f.stops
    assert (stop.account, stop.endpoint) == ("acct_1", f"{A}/hook")
    assert "410 Gone" in stop.reason
    # Held ones go back at once, to be stopped with the rest in the next exchange.
    assert f.returned == [(jobs[2], 5_000), (jobs[3], 5_000)]
    assert f.state(lanes(jobs[0])) == ("closed", "closed")


def test_an_endpoint_that_has_not_answered_yet_is_postponed_by_how_long_it_has_been_out(
    tmp_path: Path,
) -> None:
    clock = Clock()
    f = make(tmp_path, clock)
    hung = [job(A, "acct_1", f"{n}/hung") for n in range(3)]
    other = job(A, "acct_1", "0/other")
    # Beside another path of its host, the hung path sends one attempt at a time.
    assert [admit(f, j) for j in [other, *hung]] == [True, True, False, False]
    lane_key = lanes(hung[0]).lane
    assert f.rooms().postpone == {}
    clock.now += 3
    # Three seconds without an answer: its backlog moves three seconds ahead, once (as
    # does the other path's, out as long without room for more).
    assert f.rooms().postpone[lane_key] == 3000
    assert f.rooms().postpone == {}


@pytest.mark.parametrize("hung_host", [A, "https://other.example:443"], ids=["same", "other"])
def test_a_new_path_per_delivery_goes_at_once_beside_48_hung_paths_of_its_account(
    tmp_path: Path, hung_host: str
) -> None:
    # 64 senders: 32 for the account, 8 of them its reserve; fewer than the hung paths,
    # which are new endpoints too and fill the share with their first attempts.
    clock = Clock()
    f = make(tmp_path, clock, webhook_concurrency=64, webhook_account_share=0.5)
    hung = [job(hung_host, "acct_1", f"{n}/hang{i}") for i in range(48) for n in range(3)]
    sent = [j for j in hung if admit(f, j)]
    account = f.accounts["acct_1"]
    # Their first attempts fill the share.
    assert account.in_flight == len(sent) == 32
    # Out a second without an answer, first attempts are known to hang and leave
    # probation: 8 paths not tried yet get their first attempt beyond the share, and no
    # attempt had to end for it.
    clock.now += 1.0
    moved = list(f.moved(lanes))
    assert len(moved) == 8
    sent += moved
    for _ in range(10):
        clock.now += 1.0
        sent += f.moved(lanes)
    # Every hung path has an attempt out. A new path per delivery goes at once, each.
    assert all(f.destinations[lane(j)].in_flight for j in hung)
    for n in range(20):
        healthy = job(A, "acct_1", f"{n}/task{n}")
        assert admit(f, healthy)
        assert release(f, healthy, seconds=0.07) == []
    # The hung ones took no more meanwhile.
    assert account.in_flight == len(sent)
