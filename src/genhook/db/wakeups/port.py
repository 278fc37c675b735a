"""The wake-ups port: what every way of carrying wake-ups between processes provides.

Two channels: ``tasks`` (a submit or a requeue; workers listen) and ``deliveries`` (a
webhook delivery became due; dispatchers listen). A ``Hub`` is this process's listening on
one database from one event loop: it keeps the subscriptions and wakes them, in-process,
and an adapter (a ``Transport``) hears what other processes announce: PostgreSQL's
``LISTEN``/``NOTIFY`` (``genhook.db.wakeups.postgres``) or, for SQLite on one machine,
local datagram sockets (``genhook.db.wakeups.sockets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("genhook.db.wakeups")

TASKS = "tasks"
DELIVERIES = "deliveries"
CHANNELS = (TASKS, DELIVERIES)


class Wake(enum.Enum):
    """Why a ``Waiter.wait`` returned."""

    TARGETED = "targeted"  # a writer took this idle worker: its task is there, claim at once
    BROADCAST = "broadcast"  # an announcement to every listener (SQLite: read before claiming)
    LOCAL = "local"  # this process: a commit of its own, or a stop
    RECONNECTED = "reconnected"  # the PostgreSQL listener (re)connected: maybe missed some
    TIMEOUT = "timeout"  # nothing arrived: the safety-net poll


# Of several wake-ups before one wait returns, the one that tells the most.
_RANK = {Wake.TIMEOUT: 0, Wake.RECONNECTED: 1, Wake.LOCAL: 2, Wake.BROADCAST: 3, Wake.TARGETED: 4}


class Subscription(Protocol):
    def close(self) -> None: ...


class _Subscription:
    def __init__(
        self, hub: Hub, channel: str, callback: Callable[[Wake], None], pooled: bool
    ) -> None:
        self.hub = hub
        self.channel = channel
        self.callback = callback
        self.pooled = pooled
        self.waiting = False

    def close(self) -> None:
        self.hub.unsubscribe(self)


class Transport(Protocol):
    """The port: how one database's wake-ups reach this process's listeners from other
    processes. A hub calls these as its subscriptions come and go; an adapter hears what
    other processes announce and hands it to ``Hub.deliver``."""

    def open_channel(self, channel: str, pooled: bool) -> None:
        """The channel's first listener arrived: start hearing it (``pooled``: the listener
        is one of a pool of workers, any of which may take a task alone)."""

    def unpool(self, channel: str) -> None:
        """A listener that is not one of a pool joined: the channel hears everything."""

    def mark(self, channel: str, idle: bool) -> None:
        """The process's pooled listeners started (``idle``) or stopped waiting."""

    def close_channel(self, channel: str) -> None:
        """The channel's last listener left."""

    def close(self) -> None:
        """The hub's last listener left."""


class Hub(Transport):
    """This process's listening on one database, from one event loop: its subscriptions,
    woken in-process. Each adapter extends it with its ``Transport`` methods."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.subscriptions: dict[str, list[_Subscription]] = {c: [] for c in CHANNELS}

    def subscribe(
        self, channel: str, callback: Callable[[Wake], None], pooled: bool = False
    ) -> _Subscription:
        subscription = _Subscription(self, channel, callback, pooled)
        first = not self.subscriptions[channel]
        self.subscriptions[channel].append(subscription)
        if first:
            self.open_channel(channel, pooled)
        elif not pooled:
            self.unpool(channel)
        return subscription

    def unsubscribe(self, subscription: _Subscription) -> None:
        listeners = self.subscriptions[subscription.channel]
        with contextlib.suppress(ValueError):
            listeners.remove(subscription)
        if not listeners:
            self.close_channel(subscription.channel)
        elif subscription.waiting:
            self.set_waiting(subscription, False)
        if not any(self.subscriptions.values()):
            self.close()
            if HUBS.get((self.key, id(self.loop))) is self:
                del HUBS[(self.key, id(self.loop))]

    def set_waiting(self, subscription: _Subscription, waiting: bool) -> None:
        """A pooled listener starts or stops waiting: the process is idle while any waits."""
        before = self.waiting(subscription.channel)
        subscription.waiting = waiting
        after = self.waiting(subscription.channel)
        if before != after:
            self.mark(subscription.channel, after)

    def waiting(self, channel: str) -> bool:
        return any(s.waiting for s in self.subscriptions[channel])

    def poke(self, channel: str) -> None:
        """From any thread: run the channel's callbacks on the hub's loop."""
        if not self.subscriptions[channel]:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed
            self.loop.call_soon_threadsafe(self.deliver, channel, Wake.LOCAL)

    def deliver(self, channel: str, wake: Wake) -> None:
        """Run the channel's callbacks; a targeted wake-up goes to one waiting pooled
        listener only (any other listener that is not pooled hears a broadcast)."""
        listeners = list(self.subscriptions[channel])
        chosen = None
        if wake is Wake.TARGETED:
            chosen = next((s for s in listeners if s.pooled and s.waiting), None)
            if chosen is not None:
                chosen.waiting = False
                # The writer renamed the socket busy; another Waiter may still be waiting.
                self.mark(channel, self.waiting(channel))
                listeners = [s for s in listeners if s is chosen or not s.pooled]
        for subscription in listeners:
            try:
                if wake is Wake.TARGETED and subscription is not chosen:
                    subscription.callback(Wake.BROADCAST)
                else:
                    subscription.callback(wake)
            except Exception:
                log.exception("wake-up listener failed")

    def open_channel(self, channel: str, pooled: bool) -> None: ...

    def unpool(self, channel: str) -> None:
        """A listener that is not one of a pool joined: the channel hears everything."""

    def mark(self, channel: str, idle: bool) -> None: ...

    def close_channel(self, channel: str) -> None: ...

    def close(self) -> None: ...


# Each loop's hub for a database, by (database key, id(loop)).
HUBS: dict[tuple[str, int], Hub] = {}
