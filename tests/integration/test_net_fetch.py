"""fetch_input_image against real HTTP and HTTPS servers on loopback."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from genhook.errors import ErrorCode, TaskFailure
from genhook.net import AddressPolicy, client_ssl_context, fetch_input_image

IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40


# Location values a redirect may carry that no URL parser makes sense of.
BAD_LOCATIONS = [
    "http://[::1/img",
    "http://[zz]/",
    "http://host:99999/",
    "http://host:-1/",
    "//[",
    "http://[::1]x/",
    "http://a b/",
    "http://%zz/",
    "http:// /",
    "http://host.test./img",
    "http://\u00e9.test/img",
]


class MapResolver:
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    async def resolve(self, host: str, port: int) -> list[str]:
        return list(self.table.get(host, []))


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Refuses, and records, any connect to a non-loopback address."""
    refused: list[object] = []
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if host is None or not ipaddress.ip_address(str(host)).is_loopback:
            refused.append(address)
            raise ConnectionRefusedError(f"test guard: {address!r} is not loopback")
        real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield refused
    assert refused == []


class Origin:
    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0
        self.hang = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.hits.append(name)
        if name == "img":
            return web.Response(body=IMAGE, content_type="image/png")
        if name == "declared-big":
            return web.Response(body=b"x" * 5000, content_type="image/png")
        if name == "streamed-big":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for _ in range(100):
                await response.write(b"y" * 1000)
            await response.write_eof()
            return response
        if name == "missing":
            return web.Response(status=404)
        if name == "redirect-ok":
            raise web.HTTPFound(f"http://img.test:{self.port}/img")
        if name == "redirect-relative":
            raise web.HTTPMovedPermanently("/img")
        if name == "redirect-metadata":
            raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")
        if name == "redirect-odd":
            raise web.HTTPFound("http://2130706433/img")
        if name == "redirect-loop":
            raise web.HTTPFound("/redirect-loop")
        if name.startswith("bad-location-"):
            location = BAD_LOCATIONS[int(name.rsplit("-", 1)[1])]
            return web.Response(status=302, headers={"Location": location})
        if name == "hang":
            await self.hang.wait()
        return web.Response(status=500)


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    origin = Origin()
    runner = web.AppRunner(origin.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    origin.port = runner.addresses[0][1]
    yield origin
    origin.hang.set()
    await runner.cleanup()


def private_policy() -> AddressPolicy:
    return AddressPolicy(allow_private=True, resolver=MapResolver({"img.test": ["127.0.0.1"]}))


async def fetch(url: str, policy: AddressPolicy | None = None, **kw: object) -> bytes:
    return await fetch_input_image(
        url,
        policy=policy or private_policy(),
        max_bytes=int(kw.pop("max_bytes", 100_000)),  # type: ignore[call-overload]
        timeout=float(kw.pop("timeout", 5.0)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


async def expect(code: ErrorCode, url: str, **kw: object) -> TaskFailure:
    with pytest.raises(TaskFailure) as info:
        await fetch(url, **kw)  # type: ignore[arg-type]
    assert info.value.code == code, info.value.message
    return info.value


async def test_fetches_bytes(origin: Origin) -> None:
    assert await fetch(f"http://img.test:{origin.port}/img") == IMAGE
    assert await fetch(f"http://127.0.0.1:{origin.port}/img") == IMAGE


async def test_follows_checked_redirects(origin: Origin) -> None:
    assert await fetch(f"http://img.test:{origin.port}/redirect-ok") == IMAGE
    assert await fetch(f"http://img.test:{origin.port}/redirect-relative") == IMAGE


async def test_redirect_to_refused_address_never_connects(origin: Origin) -> None:
    await expect(
        ErrorCode.INPUT_ADDRESS_REFUSED, f"http://img.test:{origin.port}/redirect-metadata"
    )
    await expect(ErrorCode.INPUT_ADDRESS_REFUSED, f"http://img.test:{origin.port}/redirect-odd")
    failure = await expect(
        ErrorCode.INPUT_FETCH_FAILED, f"http://img.test:{origin.port}/redirect-loop"
    )
    assert "redirects" in failure.message


async def test_private_refused_without_allow_private(origin: Origin) -> None:
    strict = AddressPolicy(resolver=MapResolver({"img.test": ["127.0.0.1"]}))
    for url in [f"http://img.test:{origin.port}/img", f"http://127.0.0.1:{origin.port}/img"]:
        await expect(ErrorCode.INPUT_ADDRESS_REFUSED, url, policy=strict)
    assert origin.hits == []


async def test_byte_cap(origin: Origin) -> None:
    await expect(
        ErrorCode.INPUT_TOO_LARGE, f"http://img.test:{origin.port}/declared-big", max_bytes=4000
    )
    await expect(
        ErrorCode.INPUT_TOO_LARGE, f"http://img.test:{origin.port}/streamed-big", max_bytes=50_000
    )
    assert len(await fetch(f"http://img.test:{origin.port}/streamed-big", max_bytes=100_000)) == (
        100_000
    )


async def test_http_errors_and_timeouts(origin: Origin) -> None:
    await expect(ErrorCode.INPUT_FETCH_FAILED, f"http://img.test:{origin.port}/missing")
    await expect(ErrorCode.INPUT_FETCH_FAILED, f"http://img.test:{origin.port}/hang", timeout=0.3)
    await expect(ErrorCode.INPUT_FETCH_FAILED, "http://unknown.test/img")
    await expect(ErrorCode.INPUT_FETCH_FAILED, "ftp://img.test/img")


async def test_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await expect(ErrorCode.INPUT_FETCH_FAILED, f"http://img.test:{port}/img")


async def test_https_verifies_the_host_name(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("img.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client_ctx = client_ssl_context(ca_file)
    origin = Origin()
    runner = web.AppRunner(origin.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        policy = AddressPolicy(
            allow_private=True,
            resolver=MapResolver({"img.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}),
        )
        got = await fetch(f"https://img.test:{port}/img", policy, ssl_context=client_ctx)
        assert got == IMAGE
        await expect(
            ErrorCode.INPUT_FETCH_FAILED,
            f"https://other.test:{port}/img",
            policy=policy,
            ssl_context=client_ctx,
        )
        assert origin.hits == ["img"]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("index", range(len(BAD_LOCATIONS)))
async def test_unparseable_redirect_is_a_fetch_failure(origin: Origin, index: int) -> None:
    with pytest.raises(TaskFailure) as info:
        await fetch(f"http://img.test:{origin.port}/bad-location-{index}")
    assert info.value.code in (ErrorCode.INPUT_FETCH_FAILED, ErrorCode.INPUT_ADDRESS_REFUSED)
