"""Fetching input images by URL under the target-address policy.

Redirects are followed (CDNs and signed-URL services use them), at most
``MAX_REDIRECTS`` times, and every hop is parsed and checked exactly like the first URL;
the connection goes only to checked addresses. The body is capped while streaming, so a
lying or missing ``Content-Length`` cannot make the service read more than ``max_bytes``.
"""

from __future__ import annotations

import ssl

import aiohttp
from yarl import URL

from genhook.errors import ErrorCode, TaskFailure
from genhook.net._connector import pinned_connector
from genhook.net._policy import AddressPolicy, AddressRefused
from genhook.net._urls import Problem, Target, TargetRefused, parse_target

MAX_REDIRECTS = 5
# Signed object-store URLs are often longer than the webhook limit.
MAX_INPUT_URL_LENGTH = 8192
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024


async def fetch_input_image(
    url: str,
    *,
    policy: AddressPolicy,
    max_bytes: int,
    timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    accept: str = "image/*",
) -> bytes:
    """The bytes at ``url``; raises ``TaskFailure`` with an ``INPUT_*`` code otherwise."""
    client_timeout = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 10.0))
    connector = pinned_connector(policy, ssl_context=ssl_context, limit=4)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=client_timeout, auto_decompress=True
        ) as session:
            current = url
            for _ in range(MAX_REDIRECTS + 1):
                target = _parse(current)
                if target.ip is not None:
                    await policy.check_target(target)
                async with session.get(
                    target.url, allow_redirects=False, headers={"Accept": accept}
                ) as response:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not location:
                            raise _failed(f"HTTP {response.status} without a Location")
                        try:
                            current = str(target.url.join(URL(location)))
                        except (ValueError, TypeError):
                            raise _failed("a redirect's Location cannot be parsed") from None
                        continue
                    if response.status != 200:
                        raise _failed(f"HTTP {response.status}")
                    return await _read_capped(response, max_bytes)
            raise _failed(f"more than {MAX_REDIRECTS} redirects")
    except AddressRefused as exc:
        raise _refusal(exc) from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, AddressRefused):
            raise _refusal(exc.os_error) from None
        raise _failed("connection failed") from None
    except TimeoutError:
        raise _failed(f"no complete response within {timeout:g} s") from None
    except aiohttp.ClientError as exc:
        raise _failed(type(exc).__name__) from None


def _parse(url: str) -> Target:
    try:
        return parse_target(url, max_length=MAX_INPUT_URL_LENGTH)
    except TargetRefused as exc:
        if exc.problem is Problem.ADDRESS:
            raise _refused() from None
        raise _failed(f"the URL {exc.detail}") from None


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _failed(why: str) -> TaskFailure:
    return TaskFailure(ErrorCode.INPUT_FETCH_FAILED, f"the input could not be fetched: {why}")


def _refusal(exc: AddressRefused) -> TaskFailure:
    return _failed("the host does not resolve") if exc.unresolvable else _refused()


def _refused() -> TaskFailure:
    return TaskFailure(
        ErrorCode.INPUT_ADDRESS_REFUSED,
        "the input URL points at an address the service does not connect to",
    )


def _too_large(max_bytes: int) -> TaskFailure:
    return TaskFailure(
        ErrorCode.INPUT_TOO_LARGE, f"the input is larger than the {max_bytes}-byte limit"
    )
