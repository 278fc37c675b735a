"""aiohttp plumbing that connects only to addresses the policy has just checked.

aiohttp asks the resolver for a host's addresses when it opens a connection and then
connects to exactly those, so checking inside the resolver pins the connection to the
checked IPs (no window for DNS rebinding); TLS still verifies the URL's host name. The DNS
cache is off so every new connection is checked again; keep-alive reuse stays cheap.
IP-literal hosts bypass aiohttp's resolver, so callers check them with
``AddressPolicy.check_target`` before each request.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from genhook.net._addresses import parse_ip
from genhook.net._policy import AddressPolicy


class PinnedResolver(AbstractResolver):
    def __init__(self, policy: AddressPolicy, *, require_private: bool = False) -> None:
        self._policy = policy
        self._require_private = require_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await self._policy.resolve_checked(
            host.rstrip("."), port, require_private=self._require_private
        )
        results: list[ResolveResult] = []
        for text in addresses:
            ip = parse_ip(text)
            assert ip is not None
            results.append(
                {
                    "hostname": host,
                    "host": str(ip),
                    "port": port,
                    "family": socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
                    "proto": 0,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return results

    async def close(self) -> None:
        return None


def pinned_connector(
    policy: AddressPolicy,
    *,
    require_private: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    limit: int = 100,
    limit_per_host: int = 0,
    **kwargs: Any,
) -> aiohttp.TCPConnector:
    """A connector whose every new connection goes through the policy."""
    return aiohttp.TCPConnector(
        resolver=PinnedResolver(policy, require_private=require_private),
        use_dns_cache=False,
        ssl=ssl_context if ssl_context is not None else True,
        limit=limit,
        limit_per_host=limit_per_host,
        **kwargs,
    )
