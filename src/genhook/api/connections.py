"""Connection limits uvicorn lacks: header and body read deadlines, a connection cap, and
rate-limited logging of the floods those refuse.

uvicorn bounds the idle time between keep-alive requests and the size of an incomplete
header block, but not the time a client takes to send them: a request trickled a byte at a
time would hold its connection (and file descriptor) for ever. ``GuardedH11Protocol`` gives
each request ``header_timeout`` seconds from the connection's opening (or, on a kept-alive
connection, from the next request's first byte) to its complete headers, and
``body_timeout`` seconds more for its body, then closes the connection. Past
``max_connections`` open connections, a new one is answered 503 at once and closed, before
it costs more than its socket.

A request answered before its body was read (a wrong key, a body over the limit) is answered
with ``Connection: close``, and the rest of its body is read and dropped for a moment before
the connection closes: a pooled client then opens a fresh connection for its next request
rather than writing it onto a half-read one, and it reads the answer whole (closing a socket
with unread data resets it, and the client would lose the answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("genhook.connections")

_REFUSAL_BODY = json.dumps(
    {"code": 503, "message": "too many open connections; retry later", "errors": []}
).encode()
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: "
    + str(len(_REFUSAL_BODY)).encode()
    + b"\r\n\r\n"
    + _REFUSAL_BODY
)
_TIMEOUT_BODY = json.dumps(
    {"code": 408, "message": "the request was not received in time", "errors": []}
).encode()
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: "
    + str(len(_TIMEOUT_BODY)).encode()
    + b"\r\n\r\n"
    + _TIMEOUT_BODY
)


# How long a connection answered before its body was read keeps dropping what still arrives.
LINGER_SECONDS = 2.0


class RateLimitedLog:
    """At most one line per ``interval`` seconds per kind; the next line counts the rest."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) < self.interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += f" ({suppressed} more like this not logged)"
        self.logger.warning(message, *args)


_limited = RateLimitedLog(log)


class RepeatFilter(logging.Filter):
    """Lets a message through at most once per ``interval`` seconds; for the HTTP server's
    per-request warnings ("Invalid HTTP request received."), which a flood repeats."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.exc_info:
            return True
        key = str(record.msg)
        now = time.monotonic()
        if now - self._last.get(key, -self.interval) < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} more like this not logged)"
        return True


class _Connection(h11.Connection):
    """h11's server side, adding ``Connection: close`` to an answer that starts while the
    client is still sending its request body."""

    def send(self, event: Any) -> bytes | None:  # type: ignore[override]
        if isinstance(event, h11.Response) and self.their_state is h11.SEND_BODY:
            headers = [(name, value) for name, value in event.headers if name != b"connection"]
            event = h11.Response(
                status_code=event.status_code,
                headers=[*headers, (b"connection", b"close")],
                reason=event.reason,
                http_version=event.http_version,
            )
        output: bytes | None = super().send(event)
        return output


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: a close while the client is still
    sending its body becomes a lingering close (``GuardedH11Protocol.linger``)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._protocol._lingering is not None or self._transport.is_closing()

    def close(self) -> None:
        self._protocol.linger()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a connection cap (``configure``)."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 1000

    _deadline: asyncio.TimerHandle | None = None
    _awaiting: str = ""
    _lingering: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.conn._max_incomplete_event_size)

    @classmethod
    def configure(
        cls, *, header_timeout: float, body_timeout: float, max_connections: int
    ) -> type[GuardedH11Protocol]:
        """A subclass carrying these limits (uvicorn builds the protocol from a class)."""
        return type(
            "GuardedH11Protocol",
            (cls,),
            {
                "header_timeout": header_timeout,
                "body_timeout": body_timeout,
                "max_connections": max_connections,
            },
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            _limited.warning(
                "connections",
                "refused a connection: %d connections are open (GENHOOK_MAX_CONNECTIONS)",
                len(self.connections),
            )
            self.transport = transport
            transport.write(_REFUSAL)
            transport.close()
            self._refused = True
            return
        self._refused = False
        self._raw = transport
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._lingering is not None:
            self._lingering.cancel()
        if getattr(self, "_refused", False):
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if getattr(self, "_refused", False) or self._lingering is not None:
            return
        super().data_received(data)
        self._track(data_arrived=True)

    def eof_received(self) -> None:
        if self._lingering is not None:
            self._raw.close()  # the client sent everything and left: nothing to linger for

    def linger(self) -> None:
        """Close the connection; if the client is still sending its body (it was answered
        before the body was read), drop the rest unparsed for ``LINGER_SECONDS`` first, so
        it can read the answer. Parsing the rest only to drop it would cost the event loop
        as much as the body."""
        if self._lingering is not None:
            return
        if self.conn.their_state is not h11.SEND_BODY or self._raw.is_closing():
            self._raw.close()
            return
        self._disarm()
        self._lingering = self.loop.call_later(LINGER_SECONDS, self._raw.close)
        self._raw.resume_reading()  # reading may be paused for the body nobody reads now
        if self._raw.can_write_eof():
            self._raw.write_eof()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track(data_arrived=False)

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a request whose body breaks the protocol itself; its handler,
        already started, must see a disconnect rather than answer a second time."""
        super().send_400_response(msg)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()

    def _track(self, *, data_arrived: bool) -> None:
        """Move the deadline along with the request: headers, then body, then none.

        Between kept-alive requests no deadline runs: idleness there is uvicorn's
        keep-alive timeout, and a header deadline would cut a pooled client that paused
        longer than it (its next request then meets a closed socket)."""
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if not data_arrived:
                self._disarm()
            elif self._awaiting != "headers":
                self._arm("headers")
        elif state is h11.SEND_BODY:
            if self._awaiting != "body":
                self._arm("body")
        else:
            self._disarm()

    def _arm(self, what: str) -> None:
        self._disarm()
        self._awaiting = what
        delay = self.header_timeout if what == "headers" else self.body_timeout
        self._deadline = self.loop.call_later(delay, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._awaiting = ""

    def _expired(self) -> None:
        what = self._awaiting
        self._deadline = None
        self._awaiting = ""
        if self.transport.is_closing():
            return
        _limited.warning(
            "timeout-" + what,
            "closed a connection that did not send its request %s in time",
            what,
        )
        if what == "headers" and self.conn.their_state is h11.IDLE and self.cycle is None:
            # Nothing was answered on this connection yet: tell the client why.
            self.transport.write(_TIMEOUT)
        self._raw.close()  # at once, not lingering: the client is too slow to wait for


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log accept failures (file descriptors exhausted) once per interval, not per retry."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if "accept" in message:
            _limited.warning("accept", "%s: %s", message, context.get("exception"))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard one; returns the limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft
