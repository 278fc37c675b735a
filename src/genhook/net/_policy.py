"""The target-address policy: the one place that decides where the service may connect.

Used at submit time (``check_webhook_url``), and again at connect time by the pinned
resolver, so a host that resolved public at submit but private later (DNS rebinding) is
refused, and the connection goes only to the addresses that were checked.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol

from genhook.errors import FieldError, InvalidRequest
from genhook.net._addresses import Reach, classify, parse_ip
from genhook.net._urls import MAX_URL_LENGTH, Problem, Target, TargetRefused, parse_target

log = logging.getLogger(__name__)

MSG_NOT_PUBLIC = "webhook_url is not a routable public address"
MSG_NOT_HTTPS = "webhook_url must use https"
MSG_TOO_LONG = f"webhook_url exceeds the {MAX_URL_LENGTH}-character limit"
MSG_INVALID = "webhook_url is not a valid absolute URL"
# Added to a refusal that development mode would accept: a receiver on the developer's
# own machine or network is the usual first webhook_url.
DEV_MODE_HINT = (
    " (a receiver on this machine or a private network is accepted when the service runs "
    "with `genhook serve --dev`, i.e. GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS=true)"
)

_MESSAGES = {
    Problem.TOO_LONG: MSG_TOO_LONG,
    Problem.SCHEME: MSG_NOT_HTTPS,
    Problem.ADDRESS: MSG_NOT_PUBLIC,
    Problem.INVALID: MSG_INVALID,
}

RESOLVE_TIMEOUT_SECONDS = 5.0


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[str]:
        """Every address ``host`` resolves to, as text; empty when it does not resolve."""
        ...


class SystemResolver:
    """The operating system's resolver, through ``socket.getaddrinfo`` in a thread.

    Not ``loop.getaddrinfo``: under uvloop that is libuv's own C call, so the same code would
    resolve differently depending on the event loop.
    """

    async def resolve(self, host: str, port: int) -> list[str]:
        try:
            infos = await asyncio.to_thread(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _NoNames:
    """A resolver that resolves nothing: only address literals pass a check made with it."""

    async def resolve(self, host: str, port: int) -> list[str]:
        return []


class AddressRefused(OSError):
    """A connection the policy refuses; an ``OSError`` so HTTP clients treat it as one."""

    def __init__(self, detail: str, *, unresolvable: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        # The host has no address at all (as opposed to a refused one).
        self.unresolvable = unresolvable


class AddressPolicy:
    def __init__(
        self, *, allow_private: bool = False, resolver: Resolver | None = None, warn: bool = True
    ) -> None:
        self.allow_private = allow_private
        self.resolver: Resolver = resolver or SystemResolver()
        if allow_private and warn:
            log.warning(
                "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS is on: webhook and input-image URLs "
                "may target loopback and private networks; never enable this in production"
            )

    def allows(self, reach: Reach, *, require_private: bool = False) -> bool:
        if reach is Reach.BLOCKED:
            return False
        if reach is Reach.PRIVATE:
            return self.allow_private
        return not require_private

    async def resolve_checked(
        self, host: str, port: int, *, require_private: bool = False
    ) -> list[str]:
        """Resolve ``host`` and return its addresses only if every one is allowed.

        ``require_private`` is for plain-http webhook targets, allowed only towards
        private addresses (and only when private targets are allowed at all).
        """
        literal = parse_ip(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
                    addresses = await self.resolver.resolve(host, port)
            except TimeoutError:
                raise AddressRefused(f"resolving {host} timed out", unresolvable=True) from None
        if not addresses:
            raise AddressRefused(f"{host} does not resolve", unresolvable=True)
        for text in addresses:
            ip = parse_ip(text)
            if ip is None or not self.allows(classify(ip), require_private=require_private):
                raise AddressRefused(f"{host} resolves to a refused address")
        return addresses

    async def check_target(self, target: Target, *, require_private: bool = False) -> list[str]:
        return await self.resolve_checked(target.host, target.port, require_private=require_private)

    async def check_webhook_url(self, url: str) -> None:
        """Submit-time validation; the refusal names every reason that applies."""
        try:
            await self.webhook_target(url)
        except TargetRefused as exc:
            messages = [_MESSAGES[problem] for problem in exc.problems]
            hint = DEV_MODE_HINT if await self._dev_mode_accepts(url) else ""
            raise InvalidRequest(
                "; ".join(messages) + hint, [FieldError("webhook_url", m) for m in messages]
            ) from None

    async def _dev_mode_accepts(self, url: str) -> bool:
        """Whether the same URL passes with private targets allowed (``serve --dev``).

        Judged for address literals only, without resolving a name again: a refusal costs
        no second lookup, and a local receiver is nearly always ``127.0.0.1`` or ``[::1]``.
        """
        if self.allow_private:
            return False
        dev = AddressPolicy(allow_private=True, resolver=_NoNames(), warn=False)
        try:
            await dev.webhook_target(url)
        except TargetRefused:
            return False
        return True

    async def webhook_target(self, url: str) -> Target:
        """Parse and check a webhook URL; raises ``TargetRefused``.

        https is required, except that with private targets allowed, plain http may go to
        a host whose every address is private.
        """
        # Plain http is checked after the address, so that both reasons can be named.
        plain_refused = not self.allow_private and url[:5].lower() == "http:"
        try:
            target = parse_target(url)
        except TargetRefused as exc:
            if plain_refused and exc.problem is Problem.ADDRESS:
                raise TargetRefused(Problem.SCHEME, exc.detail, also=(Problem.ADDRESS,)) from None
            raise
        plain = target.scheme == "http"
        if plain_refused:
            if await self._is_allowed_over_https(target):
                raise TargetRefused(Problem.SCHEME, "uses http")
            raise TargetRefused(
                Problem.SCHEME, "uses http to a refused host", also=(Problem.ADDRESS,)
            )
        try:
            await self.check_target(target, require_private=plain)
        except AddressRefused as exc:
            if plain and await self._is_allowed_over_https(target):
                raise TargetRefused(Problem.SCHEME, "public host over http") from None
            raise TargetRefused(Problem.ADDRESS, exc.detail) from None
        return target

    async def _is_allowed_over_https(self, target: Target) -> bool:
        try:
            await self.check_target(target)
        except AddressRefused:
            return False
        return True
