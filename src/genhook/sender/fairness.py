"""Fair, isolated delivery: per-destination and per-account shares, and destination health.

A delivery worker sends to many receivers from one pool of senders. Without limits, a
receiver that never answers holds every sender for the request timeout while deliveries to
healthy receivers wait behind it. Here each *destination* (scheme, host and port of the
target) may have at most ``webhook_destination_max_in_flight`` attempts in flight and each
account at most ``webhook_account_share`` of the senders; attempts over a limit wait in
their destination's line while other destinations' attempts go straight to the senders.

Claims respect the same shares (``Rooms``): the claim statement takes at most a lane's room
per destination and per account, so a backlog to one receiver never fills the ready queue.
How much a lane may hold beyond its in-flight limit follows how fast it answers, so that a
held attempt always goes out well inside its lease.

Destination health is a circuit breaker: after ``webhook_breaker_failures`` consecutive
failed attempts (timeouts, connection errors, 5xx) a destination is *open* and none of its
deliveries are claimed until a cooldown (``genhook.retry.backoff_delay``, doubling per
reopening) has passed; then one *half-open* probe goes, and its outcome closes or reopens
the circuit. Attempts held when a circuit opens are given back unsent, due at the probe.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar
from urllib.parse import urlsplit

from genhook.config import Settings
from genhook.retry import backoff_delay

# Room a lane never seen before gets in one claim: its answer time is not known yet.
DEFAULT_ROUNDS = 1
# A held attempt should go out within this fraction of its lease.
LEASE_FRACTION = 0.25
# Weight of the newest attempt in a lane's average answer time.
EWMA_WEIGHT = 0.2
BREAKER_COOLDOWN_CAP_SECONDS = 300.0
# A lane answering faster than this on average may borrow idle senders beyond its limit.
BORROW_MAX_SECONDS = 1.0
# A destination without room whose attempts take this long on average has its due backlog
# postponed by about one answer time (see Rooms.postpone).
POSTPONE_AFTER_SECONDS = 1.0
# Idle lanes are forgotten beyond this many (their answer time with them).
MAX_LANES = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}


def destination_of(url: str) -> str:
    """``scheme://host:port`` of a webhook URL, the default port made explicit."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").rstrip(".")
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        return url[:300]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"[:300]


class Rooms(NamedTuple):
    """What a claim may take: per destination and per account; others get the default."""

    destinations: dict[str, int]
    accounts: dict[str, int]
    destination_default: int
    account_default: int
    # Slow destinations without room: their due, unclaimed deliveries move this many ms
    # ahead, so that claims need not look past them (none could be taken meanwhile).
    postpone: dict[str, int] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


class Transition(NamedTuple):
    """A destination's circuit changed; written to ``webhook_destinations`` for the API."""

    destination: str
    state: str
    consecutive_failures: int
    opened_at: int | None
    retry_at: int | None
    last_error: str | None
    at: int


def is_health_failure(status_code: int | None, error: str | None) -> bool:
    """Timeouts, connection errors and 5xx say the destination is unwell; a 4xx is an
    answer. A refused target never reached the network."""
    if status_code is None:
        return not (error or "").startswith("target refused")
    return status_code >= 500


J = TypeVar("J")


@dataclass
class Lane(Generic[J]):
    """One destination's or account's share: attempts in flight, attempts held (claimed,
    waiting or in flight), and the average time its attempts took."""

    limit: int
    in_flight: int = 0
    held: int = 0
    # Attempts in flight beyond ``limit``, on senders borrowed while the pool was idle.
    over: int = 0
    # Monotonic time until which the lane's backlog was last postponed.
    postponed_until: float = 0.0
    ewma_seconds: float | None = None
    waiting: deque[J] = field(default_factory=deque)

    def hold_cap(self, lease_seconds: float, ceiling: int) -> int:
        """How many attempts the lane may hold: its limit, plus as many rounds more as go
        out within a fraction of the lease at its answer time."""
        if self.limit <= 0:
            return 0
        if self.ewma_seconds is None:
            rounds = DEFAULT_ROUNDS
        else:
            rounds = int(lease_seconds * LEASE_FRACTION / max(self.ewma_seconds, 0.001))
        return min(ceiling, self.limit * (1 + max(0, rounds)))

    def observe(self, seconds: float) -> None:
        if self.ewma_seconds is None:
            self.ewma_seconds = seconds
        else:
            self.ewma_seconds += EWMA_WEIGHT * (seconds - self.ewma_seconds)


@dataclass
class Breaker:
    state: str = "closed"
    failures: int = 0
    openings: int = 0
    opened_at: int | None = None
    retry_at: float = 0.0  # monotonic
    retry_at_ms: int | None = None
    last_error: str | None = None


class Fairness(Generic[J]):
    """The dispatcher's admission control. Not thread-safe: the dispatcher's loop only.

    ``admit`` answers whether a held job may go to a sender now; otherwise it waits in its
    destination's line and comes back from ``release`` when a slot frees.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        lease_seconds: float,
        ceiling: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.destination_limit = settings.webhook_destination_max_in_flight
        self.account_limit = max(
            1, math.ceil(settings.webhook_concurrency * settings.webhook_account_share)
        )
        self.threshold = settings.webhook_breaker_failures
        self.cooldown = settings.webhook_breaker_cooldown_seconds
        self.lease_seconds = lease_seconds
        self.ceiling = ceiling
        self.clock = clock
        self.destinations: dict[str, Lane[J]] = {}
        self.accounts: dict[str, Lane[J]] = {}
        self.breakers: dict[str, Breaker] = {}
        self.transitions: list[Transition] = []
        # Jobs to give back unsent (their destination's circuit opened), with the time
        # they are due again (epoch ms).
        self.returned: list[tuple[J, int]] = []
        # Held jobs waiting in a line, over all lanes, and the destinations with a line.
        self.parked = 0
        # (insertion-ordered: lines move in the order they formed)
        self.lines: dict[str, None] = {}
        # Senders borrowed beyond destinations' and accounts' limits; a quarter of the pool
        # is never lent.
        self.borrowed = [0, 0]
        self.borrow_cap = settings.webhook_concurrency - settings.webhook_concurrency // 4

    # -- lanes ------------------------------------------------------------------------------

    def _destination(self, key: str) -> Lane[J]:
        lane = self.destinations.get(key)
        if lane is None:
            lane = self.destinations[key] = Lane(self.destination_limit)
        lane.limit = self._destination_limit(key)
        return lane

    def _account(self, key: str) -> Lane[J]:
        lane = self.accounts.get(key)
        if lane is None:
            lane = self.accounts[key] = Lane(self.account_limit)
        return lane

    def _destination_limit(self, key: str) -> int:
        breaker = self.breakers.get(key)
        if breaker is None or breaker.state == "closed":
            return self.destination_limit
        if breaker.state == "open":
            if self.clock() < breaker.retry_at:
                return 0
            self._move(key, breaker, "half_open")
        return 1  # half-open: one probe at a time

    def rooms(self) -> Rooms:
        """What the next claim may take, from what each lane holds now. Lanes whose room
        is the default are left out of the (JSON) parameter."""
        default = self.destination_limit * (1 + DEFAULT_ROUNDS)
        destinations: dict[str, int] = {}
        postpone: dict[str, int] = {}
        for key, lane in list(self.destinations.items()):
            lane.limit = self._destination_limit(key)
            cap = lane.hold_cap(self.lease_seconds, self.ceiling)
            if self.state(key) == "half_open":
                cap = 1
            room = max(0, cap - lane.held)
            if room != default:
                destinations[key] = room
            if room == 0 and lane.limit and (lane.ewma_seconds or 0) >= POSTPONE_AFTER_SECONDS:
                now = self.clock()
                if now >= lane.postponed_until:
                    shift = max(lane.ewma_seconds or 0, POSTPONE_AFTER_SECONDS)
                    lane.postponed_until = now + shift
                    postpone[key] = int(shift * 1000)
            elif len(self.destinations) > MAX_LANES and not lane.held and key not in self.breakers:
                del self.destinations[key]
        account_default = self.account_limit * (1 + DEFAULT_ROUNDS)
        accounts: dict[str, int] = {}
        for key, lane in list(self.accounts.items()):
            room = max(0, lane.hold_cap(self.lease_seconds, self.ceiling) - lane.held)
            if room != account_default:
                accounts[key] = room
            elif len(self.accounts) > MAX_LANES and not lane.held:
                del self.accounts[key]
        return Rooms(destinations, accounts, default, account_default, postpone)

    # -- admission --------------------------------------------------------------------------

    def admit(self, job: J, destination: str, account: str) -> bool:
        """Hold ``job``; True when it may be sent now, else it waits in line."""
        lane = self._destination(destination)
        account_lane = self._account(account)
        lane.held += 1
        account_lane.held += 1
        if lane.limit == 0:
            # The circuit opened after this claim: give it back, due at the probe.
            self._give_back(job, destination, account)
            return False
        if not lane.waiting and self._room(lane, account_lane):
            self._take(lane, account_lane)
            return True
        lane.waiting.append(job)
        self.lines.setdefault(destination, None)
        self.parked += 1
        return False

    def _room(self, lane: Lane[J], account_lane: Lane[J]) -> bool:
        # Borrowing only while no other destination's attempt waits in line.
        alone = self.parked == len(lane.waiting)
        return (
            lane.in_flight < lane.limit or (alone and self._may_borrow(lane, self.borrowed[0]))
        ) and (
            account_lane.in_flight < account_lane.limit
            or (alone and self._may_borrow(account_lane, self.borrowed[1]))
        )

    def _may_borrow(self, lane: Lane[J], borrowed: int) -> bool:
        """A lane over its limit may use idle senders while it answers fast and a reserve
        stays free: a healthy receiver alone gets the whole pool, a slow one never more
        than its share, and a newcomer always finds a sender."""
        return (lane.limit == self.destination_limit or lane.limit == self.account_limit) and (
            lane.ewma_seconds is not None
            and lane.ewma_seconds <= BORROW_MAX_SECONDS
            and borrowed < self.borrow_cap
        )

    def _take(self, lane: Lane[J], account_lane: Lane[J]) -> None:
        for i, one in enumerate((lane, account_lane)):
            if one.in_flight >= one.limit:
                one.over += 1
                self.borrowed[i] += 1
            one.in_flight += 1

    def _give(self, lane: Lane[J], account_lane: Lane[J]) -> None:
        for i, one in enumerate((lane, account_lane)):
            one.in_flight -= 1
            if one.over:
                one.over -= 1
                self.borrowed[i] -= 1

    def _give_back(self, job: J, destination: str, account: str) -> None:
        self.destinations[destination].held -= 1
        self.accounts[account].held -= 1
        breaker = self.breakers.get(destination)
        due = breaker.retry_at_ms if breaker is not None and breaker.retry_at_ms else 0
        self.returned.append((job, due))

    def release(
        self,
        destination: str,
        account: str,
        *,
        seconds: float,
        failed: bool,
        error: str | None,
        now_ms: int,
        key: Callable[[J], tuple[str, str]],
    ) -> Iterator[J]:
        """An attempt ended: free its slots, update the destination's health, and yield
        the held jobs that may be sent now (``key`` gives a job's destination and account)."""
        lane = self._destination(destination)
        account_lane = self._account(account)
        self._give(lane, account_lane)
        lane.held -= 1
        account_lane.held -= 1
        lane.observe(seconds)
        account_lane.observe(seconds)
        self._health(destination, failed, error, now_ms)
        lane = self._destination(destination)
        if lane.limit == 0:
            while lane.waiting:
                job = lane.waiting.popleft()
                self.parked -= 1
                self._give_back(job, *key(job))
        yield from self._drain(lane, key)
        if self._room(lane, account_lane) or account_lane.in_flight < account_lane.limit:
            # A slot of this account freed: another destination's line may move now.
            for other_key in list(self.lines):
                other = self.destinations[other_key]
                if other is not lane:
                    other.limit = self._destination_limit(other_key)
                    yield from self._drain(other, key)
        for line in [k for k in self.lines if not self.destinations[k].waiting]:
            del self.lines[line]

    def _drain(self, lane: Lane[J], key: Callable[[J], tuple[str, str]]) -> Iterator[J]:
        while lane.waiting and lane.limit > 0:
            account_lane = self._account(key(lane.waiting[0])[1])
            if not self._room(lane, account_lane):
                return
            job = lane.waiting.popleft()
            self.parked -= 1
            self._take(lane, account_lane)
            yield job

    # -- health -----------------------------------------------------------------------------

    def _health(self, destination: str, failed: bool, error: str | None, now_ms: int) -> None:
        breaker = self.breakers.get(destination)
        if not failed:
            if breaker is not None:
                if breaker.state != "closed":
                    breaker.failures = 0
                    breaker.openings = 0
                    self._move(destination, breaker, "closed", now_ms)
                del self.breakers[destination]
            return
        if breaker is None:
            breaker = self.breakers[destination] = Breaker()
        breaker.failures += 1
        breaker.last_error = error
        if breaker.state == "half_open" or (
            breaker.state == "closed" and breaker.failures >= self.threshold
        ):
            breaker.openings += 1
            delay = backoff_delay(breaker.openings, self.cooldown, BREAKER_COOLDOWN_CAP_SECONDS)
            breaker.retry_at = self.clock() + delay
            breaker.retry_at_ms = now_ms + int(delay * 1000)
            breaker.opened_at = now_ms
            self._move(destination, breaker, "open", now_ms)

    def _move(self, destination: str, breaker: Breaker, state: str, now: int | None = None) -> None:
        breaker.state = state
        at = now if now is not None else int(time.time() * 1000)
        self.transitions.append(
            Transition(
                destination,
                state,
                breaker.failures,
                breaker.opened_at if state != "closed" else None,
                breaker.retry_at_ms if state == "open" else None,
                breaker.last_error,
                at,
            )
        )

    def state(self, destination: str) -> str:
        breaker = self.breakers.get(destination)
        return "closed" if breaker is None else breaker.state
