"""Fair, isolated delivery: per-endpoint, per-host and per-account shares, and health.

A delivery worker sends to many receivers from one pool of senders. One receiver host often
serves many endpoints (one app with many paths; a hosted receiver serving thousands of
customers from one hostname), so the unit of fairness and of health is the *endpoint*: the
URL without its query, of one account (``Route.lane``). Nothing one account does uses up
another account's share of anything: every lane, share and circuit below is the account's
own.

- An endpoint has at most ``webhook_destination_max_in_flight`` attempts in flight. Until
  it has answered once, an endpoint that shares its host with others of the account in
  flight sends one attempt at a time, so a receiver app whose paths hang cannot fill the
  account's share with them before one has answered.
- An account has at most ``webhook_account_share`` of the senders. A quarter of that share
  is kept for its *trusted* endpoints (answering within a second on average) and for an
  endpoint's first attempt, so a healthy endpoint keeps flowing beside the account's
  hanging ones. A new endpoint's first attempt may also go beyond the shares on a
  *probation* lane as large as the reserve: first attempts out for under
  ``BORROW_MAX_SECONDS``. One out longer is known to hang and leaves it (``moved`` lets the
  lines move then), so a new endpoint never waits for hung ones to time out.
- A host (scheme, host and port) has at most ``webhook_host_max_in_flight`` of the account's
  attempts in flight: a generous safety limit for the receiver's machine, kept the same way.

Attempts over a limit wait in their endpoint's line while other lines go straight to the
senders. Claims respect the same shares (``Rooms``): the claim statement takes at most a
lane's room per endpoint and per account, so a backlog to one endpoint never fills the ready
queue. How much a lane may hold beyond its in-flight limit follows how fast it answers, so
that a held attempt always goes out well inside its lease.

Health is two levels of circuit breaker. HTTP-level failures (timeouts, 5xx, 429) count
against the endpoint: after ``webhook_breaker_failures`` in a row its circuit opens and none
of its deliveries are claimed until a cooldown (``genhook.retry.backoff_delay``, doubling
per reopening) has passed; then one *half-open* probe goes, and its outcome closes or
reopens the circuit. A 429 or 503 with ``Retry-After`` opens it until then. A failure to
connect (refused, reset, TLS, DNS) counts against the host instead, whose circuit holds
back every endpoint of the account on it the same way. Attempts held when a circuit opens
are given back unsent, due at the probe. A ``410 Gone`` stops the endpoint's pending
deliveries (``Fairness.stops``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Literal, NamedTuple, TypeVar
from urllib.parse import urlsplit

from genhook.config import Settings
from genhook.retry import backoff_delay, clamp

# Room a lane never seen before gets in one claim: its first attempt alone.
NEW_LANE_ROOM = 1
# Rounds of its limit a lane that has not answered yet may hold.
DEFAULT_ROUNDS = 1
# A held attempt should go out within this fraction of its lease.
LEASE_FRACTION = 0.25
# Weight of the newest attempt in a lane's average answer time.
EWMA_WEIGHT = 0.2
BREAKER_COOLDOWN_CAP_SECONDS = 300.0
# A Retry-After is honoured within these bounds (seconds); the upper one is the retry cap.
RETRY_AFTER_MIN_SECONDS = 1.0
# A lane answering faster than this on average is trusted: it may use the share's reserve
# and borrow idle senders beyond its limit.
BORROW_MAX_SECONDS = 1.0
# The part of an account's (or host's) share kept for trusted endpoints and first attempts.
RESERVE_FRACTION = 0.25
# An endpoint without room whose attempts take this long on average has its due backlog
# postponed by about one answer time (see Rooms.postpone).
POSTPONE_AFTER_SECONDS = 1.0
# Idle lanes are forgotten beyond this many (their answer time with them).
MAX_LANES = 4096
_DEFAULT_PORTS = {"http": 80, "https": 443}

Scope = Literal["endpoint", "host"]


def _split(url: str) -> tuple[str, str] | None:
    """``scheme://host:port`` and the path of a URL, or None when it does not parse."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").rstrip(".")
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}", parts.path or "/"


def destination_of(url: str) -> str:
    """``scheme://host:port`` of a webhook URL, the default port made explicit: its host."""
    split = _split(url)
    return (url if split is None else split[0])[:300]


def endpoint_of(url: str) -> str:
    """The endpoint of a webhook URL: its host (as ``destination_of``) and path, without
    the query or fragment, which often carry a per-task token rather than a receiver."""
    split = _split(url)
    return (url if split is None else split[0] + split[1])[:2000]


class Route(NamedTuple):
    """Where one attempt goes, for fairness: its account, endpoint and host."""

    account: str
    endpoint: str
    host: str

    @property
    def lane(self) -> str:
        """The endpoint lane's key, also the claim statement's (``account endpoint``)."""
        return f"{self.account} {self.endpoint}"

    @property
    def host_lane(self) -> str:
        return f"{self.account} {self.host}"


class Rooms(NamedTuple):
    """What a claim may take: per endpoint lane (``Route.lane``) and per account; lanes not
    listed get the default."""

    destinations: dict[str, int]
    accounts: dict[str, int]
    destination_default: int
    account_default: int
    # Slow lanes without room: their due, unclaimed deliveries move this many ms ahead, so
    # that claims need not look past them (none could be taken meanwhile).
    postpone: dict[str, int] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


class Transition(NamedTuple):
    """A circuit changed; written to ``webhook_destinations`` for the API."""

    account: str
    scope: Scope
    # The endpoint (scope endpoint) or ``scheme://host:port`` (scope host).
    target: str
    state: str
    consecutive_failures: int
    opened_at: int | None
    retry_at: int | None
    last_error: str | None
    at: int


class Stop(NamedTuple):
    """An endpoint answered ``410 Gone``: its pending deliveries stop, with this reason."""

    account: str
    endpoint: str
    reason: str


def failure_scope(status_code: int | None, error: str | None) -> Scope | None:
    """What a failed attempt says is unwell, if anything. A connection that could not be
    made (refused, reset, TLS, DNS) is the host's; a timeout, a 5xx or a 429 is the
    endpoint's; another 4xx is an answer. A refused target never reached the network."""
    if status_code is None:
        text = error or ""
        if not text or text.startswith("target refused"):
            return None
        if text.startswith(("connection failed", "TLS")):
            return "host"
        return "endpoint"
    return "endpoint" if status_code >= 500 or status_code == 429 else None


def is_health_failure(status_code: int | None, error: str | None) -> bool:
    return failure_scope(status_code, error) is not None


J = TypeVar("J")


@dataclass
class Lane(Generic[J]):
    """One endpoint's, host's or account's share: attempts in flight, attempts held
    (claimed, waiting or in flight), and the average time its attempts took."""

    limit: int
    in_flight: int = 0
    held: int = 0
    # Attempts in flight beyond ``limit``, on senders borrowed while the pool was idle.
    over: int = 0
    # Attempts in flight that an untrusted endpoint sent (shares only).
    untrusted: int = 0
    # Monotonic time until which the lane's backlog was last postponed.
    postponed_until: float = 0.0
    ewma_seconds: float | None = None
    # Whether its last attempt failed (an endpoint lane).
    failing: bool = False
    # Monotonic time its first attempt went out, while it has not answered yet.
    first_sent: float = 0.0
    # First attempts in flight of endpoints that have not answered yet, by lane, with the
    # time each went out (shares only): the probation lane.
    firsts: dict[str, float] = field(default_factory=dict)
    waiting: deque[J] = field(default_factory=deque)

    @property
    def trusted(self) -> bool:
        """It answers, and fast: it may use a share's reserve and borrow idle senders."""
        return (
            not self.failing
            and self.ewma_seconds is not None
            and self.ewma_seconds <= BORROW_MAX_SECONDS
        )

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


def reserve(limit: int) -> int:
    return max(1, int(limit * RESERVE_FRACTION)) if limit > 1 else 0


@dataclass
class Breaker:
    account: str
    scope: Scope
    target: str
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
    endpoint's line and comes back from ``release`` when a slot frees.
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
        self.host_limit = settings.webhook_host_max_in_flight
        self.threshold = settings.webhook_breaker_failures
        self.cooldown = settings.webhook_breaker_cooldown_seconds
        self.retry_cap = settings.webhook_retry_cap_seconds
        self.lease_seconds = lease_seconds
        self.ceiling = ceiling
        self.clock = clock
        # Endpoint lanes by ``Route.lane``, with the route each was last seen with.
        self.destinations: dict[str, Lane[J]] = {}
        self.routes: dict[str, Route] = {}
        self.accounts: dict[str, Lane[J]] = {}
        self.hosts: dict[str, Lane[J]] = {}
        # Circuits by ``Route.lane`` (endpoint) or ``Route.host_lane`` (host).
        self.breakers: dict[str, Breaker] = {}
        self.transitions: list[Transition] = []
        self.stops: list[Stop] = []
        # Jobs to give back unsent (a circuit opened), with the time they are due again
        # (epoch ms).
        self.returned: list[tuple[J, int]] = []
        # Held jobs waiting in a line, over all lanes, and the lanes with a line.
        self.parked = 0
        # (insertion-ordered: lines move in the order they formed)
        self.lines: dict[str, None] = {}
        # Senders borrowed beyond endpoints' and accounts' limits; a quarter of the pool
        # is never lent.
        self.borrowed = [0, 0]
        self.borrow_cap = settings.webhook_concurrency - settings.webhook_concurrency // 4
        # When the next first attempt leaves probation (monotonic): lines may move then,
        # though no attempt ended (``moved``).
        self.probation_due = math.inf

    # -- lanes ------------------------------------------------------------------------------

    def _lane(self, route: Route) -> Lane[J]:
        key = route.lane
        lane = self.destinations.get(key)
        if lane is None:
            lane = self.destinations[key] = Lane(self.destination_limit)
            self.routes[key] = route
        lane.limit = self._endpoint_limit(route)
        return lane

    def _account(self, key: str) -> Lane[J]:
        lane = self.accounts.get(key)
        if lane is None:
            lane = self.accounts[key] = Lane(self.account_limit)
        return lane

    def _host(self, route: Route) -> Lane[J]:
        key = route.host_lane
        lane = self.hosts.get(key)
        if lane is None:
            lane = self.hosts[key] = Lane(self.host_limit)
        return lane

    def _circuit(self, key: str) -> int | None:
        """0 while ``key``'s circuit is open, 1 while half-open (one probe), else None."""
        breaker = self.breakers.get(key)
        if breaker is None or breaker.state == "closed":
            return None
        if breaker.state == "open":
            if self.clock() < breaker.retry_at:
                return 0
            self._move(breaker, "half_open")
        return 1

    def _endpoint_limit(self, route: Route) -> int:
        host = self._circuit(route.host_lane)
        if host == 0:
            return 0
        if host == 1:
            # Half-open host: one probe for all its endpoints.
            hosted = self.hosts.get(route.host_lane)
            lane = self.destinations.get(route.lane)
            mine = lane.in_flight if lane is not None else 0
            return 1 if hosted is None or hosted.in_flight - mine == 0 else 0
        endpoint = self._circuit(route.lane)
        return self.destination_limit if endpoint is None else endpoint

    def rooms(self) -> Rooms:
        """What the next claim may take, from what each lane holds now. Lanes whose room
        is the default are left out of the (JSON) parameter.

        Where an account's untrusted endpoints hold all but the reserve of its room, they
        get no more, and the account's room stays at least the reserve, for its trusted and
        new endpoints."""
        destinations: dict[str, int] = {}
        postpone: dict[str, int] = {}
        untrusted_held: dict[str, int] = {}
        for key, lane in list(self.destinations.items()):
            route = self.routes[key]
            lane.limit = self._endpoint_limit(route)
            if not lane.trusted:
                untrusted_held[route.account] = untrusted_held.get(route.account, 0) + lane.held
        account_default = self.account_limit * (1 + DEFAULT_ROUNDS)
        accounts: dict[str, int] = {}
        crowded: set[str] = set()
        for key, share in list(self.accounts.items()):
            cap = share.hold_cap(self.lease_seconds, self.ceiling)
            kept = reserve(share.limit) * (1 + DEFAULT_ROUNDS)
            untrusted = untrusted_held.get(key, 0)
            if untrusted >= cap - kept:
                crowded.add(key)
            room = max(0, cap - share.held, kept - (share.held - untrusted))
            if room != account_default:
                accounts[key] = room
            elif len(self.accounts) > MAX_LANES and not share.held:
                del self.accounts[key]
        for key, lane in list(self.destinations.items()):
            route = self.routes[key]
            cap = lane.hold_cap(self.lease_seconds, self.ceiling)
            if self._probing(route):
                cap = min(cap, 1)
            elif self._slow_start(lane, route):
                cap = min(cap, max(1, lane.in_flight))
            if not lane.trusted and route.account in crowded and not self._unheard(lane):
                cap = 0
            room = max(0, cap - lane.held)
            if room != NEW_LANE_ROOM:
                destinations[key] = room
            if room == 0 and lane.limit and self._answer_time(lane) >= POSTPONE_AFTER_SECONDS:
                now = self.clock()
                if now >= lane.postponed_until:
                    shift = max(self._answer_time(lane), POSTPONE_AFTER_SECONDS)
                    lane.postponed_until = now + shift
                    postpone[key] = int(shift * 1000)
            elif len(self.destinations) > MAX_LANES and not lane.held and key not in self.breakers:
                del self.destinations[key]
                del self.routes[key]
        for key, share in list(self.hosts.items()):
            if len(self.hosts) > MAX_LANES and not share.held and key not in self.breakers:
                del self.hosts[key]
        return Rooms(destinations, accounts, NEW_LANE_ROOM, account_default, postpone)

    def _answer_time(self, lane: Lane[J]) -> float:
        """How long the lane's attempts take: on average, or, before its first answer, at
        least as long as its first attempt has been out."""
        if lane.ewma_seconds is not None:
            return lane.ewma_seconds
        return self.clock() - lane.first_sent if lane.in_flight and lane.first_sent else 0.0

    @staticmethod
    def _unheard(lane: Lane[J]) -> bool:
        """Never answered and holding nothing: a new endpoint (or one given back unsent)."""
        return lane.ewma_seconds is None and not lane.held

    def _probation(self, account: Lane[J]) -> int:
        """How many of the account's first attempts are on probation: out for less than
        BORROW_MAX_SECONDS. One out longer without an answer is known to hang."""
        now = self.clock()
        return sum(now - t < BORROW_MAX_SECONDS for t in account.firsts.values())

    def _probing(self, route: Route) -> bool:
        return any(
            (b := self.breakers.get(key)) is not None and b.state == "half_open"
            for key in (route.lane, route.host_lane)
        )

    def _slow_start(self, lane: Lane[J], route: Route) -> bool:
        """A lane that has not answered yet, beside other attempts of its account to its
        host, sends one attempt at a time."""
        if lane.ewma_seconds is not None:
            return False
        host = self.hosts.get(route.host_lane)
        return host is not None and host.in_flight > lane.in_flight

    # -- admission --------------------------------------------------------------------------

    def admit(self, job: J, route: Route) -> bool:
        """Hold ``job``; True when it may be sent now, else it waits in line."""
        lane = self._lane(route)
        account = self._account(route.account)
        host = self._host(route)
        for one in (lane, account, host):
            one.held += 1
        if lane.limit == 0:
            # A circuit opened after this claim: give it back, due at the probe.
            self._give_back(job, route)
            return False
        if not lane.waiting and self._room(lane, route, account, host):
            self._take(lane, account, host, route)
            return True
        lane.waiting.append(job)
        self.lines.setdefault(route.lane, None)
        self.parked += 1
        return False

    def _room(self, lane: Lane[J], route: Route, account: Lane[J], host: Lane[J]) -> bool:
        if self._slow_start(lane, route) and lane.in_flight:
            return False
        # Borrowing only while no other lane's attempt waits in line.
        alone = self.parked == len(lane.waiting)
        if not (
            lane.in_flight < lane.limit or (alone and self._may_borrow(lane, self.borrowed[0]))
        ):
            return False
        first = lane.ewma_seconds is None and lane.in_flight == 0
        if (
            first
            and self._probation(account) < reserve(account.limit)
            and self.borrowed[1] < self.borrow_cap
            and host.in_flight < host.limit
        ):
            # The probation lane: a few first attempts a second go out whatever the account's
            # attempts known to hang hold, so that a new endpoint never waits behind them.
            return True
        for share in (account, host):
            if lane.trusted:
                if share.in_flight >= share.limit and not (
                    share is account and alone and self._may_borrow(lane, self.borrowed[1])
                ):
                    return False
            elif (
                share.untrusted >= share.limit - reserve(share.limit)
                and not (first and share.in_flight < share.limit)
            ) or share.in_flight >= share.limit:
                return False
        return True

    def _may_borrow(self, lane: Lane[J], borrowed: int) -> bool:
        """A trusted endpoint over a limit may use idle senders while a reserve stays free:
        a healthy receiver alone gets the whole pool, a slow one never more than its share,
        and a newcomer always finds a sender."""
        return lane.limit == self.destination_limit and lane.trusted and borrowed < self.borrow_cap

    def _take(self, lane: Lane[J], account: Lane[J], host: Lane[J], route: Route) -> None:
        if lane.ewma_seconds is None and not lane.in_flight:
            lane.first_sent = self.clock()
            account.firsts[route.lane] = lane.first_sent
            self.probation_due = min(self.probation_due, lane.first_sent + BORROW_MAX_SECONDS)
        for i, one in enumerate((lane, account)):
            if one.in_flight >= one.limit:
                one.over += 1
                self.borrowed[i] += 1
            one.in_flight += 1
        host.in_flight += 1
        if not lane.trusted:
            lane.untrusted += 1
            account.untrusted += 1
            host.untrusted += 1

    def _give(self, lane: Lane[J], account: Lane[J], host: Lane[J]) -> None:
        for i, one in enumerate((lane, account)):
            one.in_flight -= 1
            if one.over:
                one.over -= 1
                self.borrowed[i] -= 1
        host.in_flight -= 1
        if lane.untrusted:
            lane.untrusted -= 1
            account.untrusted -= 1
            host.untrusted -= 1

    def _give_back(self, job: J, route: Route, due: int | None = None) -> None:
        for one in (self.destinations[route.lane], self.accounts[route.account]):
            one.held -= 1
        self.hosts[route.host_lane].held -= 1
        if due is None:
            due = 0
            for key in (route.host_lane, route.lane):
                breaker = self.breakers.get(key)
                if breaker is not None and breaker.state == "open" and breaker.retry_at_ms:
                    due = max(due, breaker.retry_at_ms)
        self.returned.append((job, due))

    def release(
        self,
        route: Route,
        *,
        seconds: float,
        status_code: int | None,
        error: str | None,
        now_ms: int,
        key: Callable[[J], Route],
        retry_after: float | None = None,
    ) -> Iterator[J]:
        """An attempt ended: free its slots, update health, and yield the held jobs that
        may be sent now (``key`` gives a job's route)."""
        lane = self._lane(route)
        account = self._account(route.account)
        host = self._host(route)
        self._give(lane, account, host)
        for one in (lane, account, host):
            one.held -= 1
        account.firsts.pop(route.lane, None)
        scope = failure_scope(status_code, error)
        if scope != "host":
            # A connection that was never made says nothing of the endpoint's answer time.
            lane.observe(seconds)
            account.observe(seconds)
            lane.failing = scope is not None
        self._health(route, scope, error, now_ms, retry_after if status_code else None)
        if status_code == 410:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000))
            reason = f"stopped unsent: the endpoint answered 410 Gone at {when}"
            self.stops.append(Stop(route.account, route.endpoint, reason))
        lane = self._lane(route)
        if lane.limit == 0 or status_code == 410:
            while lane.waiting:
                job = lane.waiting.popleft()
                self.parked -= 1
                self._give_back(job, key(job), now_ms if status_code == 410 else None)
        if self._circuit(route.host_lane) == 0:
            # The host's circuit opened: every line to it goes back.
            for other_key in list(self.lines):
                if other_key != route.lane and self.routes[other_key].host_lane == route.host_lane:
                    other = self._lane(self.routes[other_key])
                    while other.waiting:
                        job = other.waiting.popleft()
                        self.parked -= 1
                        self._give_back(job, key(job))
        yield from self._drain(lane, key)
        # A slot freed: other lines may move now.
        yield from self._drain_lines(key, lane)

    def moved(self, key: Callable[[J], Route]) -> Iterator[J]:
        """The held jobs that may be sent now that a first attempt left probation (its
        slot there is free, although the attempt may still hang)."""
        now = self.clock()
        if now < self.probation_due:
            return
        self.probation_due = min(
            (
                t + BORROW_MAX_SECONDS
                for share in self.accounts.values()
                for t in share.firsts.values()
                if t + BORROW_MAX_SECONDS > now
            ),
            default=math.inf,
        )
        yield from self._drain_lines(key)

    def _drain_lines(self, key: Callable[[J], Route], done: Lane[J] | None = None) -> Iterator[J]:
        for other_key in list(self.lines):
            other = self.destinations[other_key]
            if other is not done:
                other.limit = self._endpoint_limit(self.routes[other_key])
                yield from self._drain(other, key)
        for line in [k for k in self.lines if not self.destinations[k].waiting]:
            del self.lines[line]

    def _drain(self, lane: Lane[J], key: Callable[[J], Route]) -> Iterator[J]:
        while lane.waiting and lane.limit > 0:
            route = key(lane.waiting[0])
            account = self._account(route.account)
            host = self._host(route)
            if not self._room(lane, route, account, host):
                return
            job = lane.waiting.popleft()
            self.parked -= 1
            self._take(lane, account, host, route)
            yield job

    # -- health -----------------------------------------------------------------------------

    def _health(
        self,
        route: Route,
        scope: Scope | None,
        error: str | None,
        now_ms: int,
        retry_after: float | None,
    ) -> None:
        if scope is None:
            self._healthy(route.lane, now_ms)
            self._healthy(route.host_lane, now_ms)
            return
        if scope == "endpoint":
            # An answer, or a timeout after connecting: the host is reachable.
            self._healthy(route.host_lane, now_ms)
            key, target = route.lane, route.endpoint
        else:
            key, target = route.host_lane, route.host
        breaker = self.breakers.get(key)
        if breaker is None:
            breaker = self.breakers[key] = Breaker(route.account, scope, target)
        breaker.failures += 1
        breaker.last_error = error
        if retry_after is not None:
            # The receiver said when to come back: the circuit is open until then.
            self._open(breaker, clamp(retry_after, RETRY_AFTER_MIN_SECONDS, self.retry_cap), now_ms)
        elif breaker.state == "half_open" or (
            breaker.state == "closed" and breaker.failures >= self.threshold
        ):
            breaker.openings += 1
            delay = backoff_delay(breaker.openings, self.cooldown, BREAKER_COOLDOWN_CAP_SECONDS)
            self._open(breaker, delay, now_ms)

    def _healthy(self, key: str, now_ms: int) -> None:
        breaker = self.breakers.get(key)
        if breaker is None:
            return
        if breaker.state != "closed":
            breaker.failures = 0
            breaker.openings = 0
            self._move(breaker, "closed", now_ms)
        del self.breakers[key]

    def _open(self, breaker: Breaker, delay: float, now_ms: int) -> None:
        breaker.retry_at = self.clock() + delay
        breaker.retry_at_ms = now_ms + int(delay * 1000)
        breaker.opened_at = now_ms
        self._move(breaker, "open", now_ms)

    def _move(self, breaker: Breaker, state: str, now: int | None = None) -> None:
        breaker.state = state
        at = now if now is not None else int(time.time() * 1000)
        self.transitions.append(
            Transition(
                breaker.account,
                breaker.scope,
                breaker.target,
                state,
                breaker.failures,
                breaker.opened_at if state != "closed" else None,
                breaker.retry_at_ms if state == "open" else None,
                breaker.last_error,
                at,
            )
        )

    def state(self, route: Route) -> tuple[str, str]:
        """The states of ``route``'s endpoint and host circuits."""
        endpoint = self.breakers.get(route.lane)
        host = self.breakers.get(route.host_lane)
        return (
            "closed" if endpoint is None else endpoint.state,
            "closed" if host is None else host.state,
        )
