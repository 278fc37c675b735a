"""The target-address policy: a hostile-URL corpus, all refused without any connection."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest

from genhook.errors import InvalidRequest
from genhook.net import (
    MSG_INVALID,
    MSG_NOT_HTTPS,
    MSG_NOT_PUBLIC,
    MSG_TOO_LONG,
    AddressPolicy,
    AddressRefused,
    Reach,
    classify,
)
from genhook.net._policy import (
    DEV_MODE_HINT,
)

PUBLIC_V4 = "93.184.216.34"
PUBLIC_V6 = "2606:4700:4700::1111"


class MapResolver:
    """Answers from a fixed table; unknown names do not resolve."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return list(self.table.get(host, []))


TABLE = {
    "public.test": [PUBLIC_V4],
    "public6.test": [PUBLIC_V6],
    "rebind.test": ["127.0.0.1"],
    "mixed.test": [PUBLIC_V4, "10.0.0.1"],
    "ula.test": ["fd00::1"],
    "metadata.test": ["169.254.169.254"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "cgnat.test": ["100.64.1.1"],
    "zero.test": ["0.0.0.0"],
    "garbage.test": ["not-an-ip"],
    "private.test": ["192.168.1.10"],
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Fails any socket connect or system DNS lookup: refusal must happen before either."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise AssertionError(f"connection attempted to {address!r}")

    def refuse_dns(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError(f"system DNS used for {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_dns)
    yield attempts
    assert attempts == []


@pytest.fixture
def policy() -> AddressPolicy:
    return AddressPolicy(resolver=MapResolver(TABLE))


NOT_PUBLIC = [
    # Loopback, private, link-local, CGNAT and other special IPv4 ranges.
    "https://127.0.0.1/hook",
    "https://127.255.255.254/hook",
    "https://10.0.0.1/",
    "https://172.16.0.1/",
    "https://172.31.255.255/",
    "https://192.168.0.1/",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/",
    "https://100.127.255.254/",
    "https://0.0.0.0/",
    "https://0.1.2.3/",
    "https://198.18.0.1/",
    "https://198.19.255.255/",
    "https://224.0.0.1/",
    "https://239.255.255.250/",
    "https://240.0.0.1/",
    "https://255.255.255.255/",
    "https://192.0.0.1/",
    "https://192.0.2.1/",
    "https://198.51.100.7/",
    "https://203.0.113.9/",
    # Odd IPv4 spellings.
    "https://2130706433/",
    "https://0x7f000001/",
    "https://0x7f.1/",
    "https://0177.0.0.1/",
    "https://127.1/",
    "https://127.0.1/",
    "https://017700000001/",
    "https://127.000.000.001/",
    "https://0x7F.0x00.0x00.0x01/",
    "https://1.2.3.4.5/",
    "https://8.8.8.8.8/",
    "https://3232235521/",
    # IPv6, and IPv6 forms that wrap a blocked IPv4 address.
    "https://[::1]/",
    "https://[::]/",
    "https://[fe80::1]/",
    "https://[fd00::1]/",
    "https://[fc00::abcd]/",
    "https://[ff02::1]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:7f00:1]/",
    "https://[::ffff:10.0.0.1]/",
    "https://[::ffff:169.254.169.254]/",
    "https://[::127.0.0.1]/",
    "https://[2002:7f00:1::]/",
    "https://[2002:a00:1::1]/",
    "https://[64:ff9b::127.0.0.1]/",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[64:ff9b:1::8.8.8.8]/",
    "https://[2001:db8::1]/",
    "https://[2001::1]/",
    "https://[fec0::1]/",
    "https://[fe80::1%25eth0]/",
    # Userinfo tricks.
    "https://public.test@127.0.0.1/",
    "https://user:pass@public.test/",
    "https://public.test:443@10.0.0.1/",
    "https://127.0.0.1#@public.test/",
    "https://@public.test/",
    # Names that resolve to refused addresses, or not at all.
    "https://rebind.test/",
    "https://mixed.test/",
    "https://ula.test/",
    "https://metadata.test/",
    "https://mapped.test/",
    "https://cgnat.test/",
    "https://zero.test/",
    "https://garbage.test/",
    "https://unknown.test/",
    "https://localhost/",
    "https://localhost./",
    # A trailing dot: TLS name checks and Host headers downstream cannot use it.
    "https://public.test./hook",
    # Hosts that are not host names.
    "https://pub%6cic.test/",
    "https://-bad-.test/",
    "https://a..test/",
    "https://under_score.test/",
]

NOT_HTTPS = [
    "http://public.test/hook",
    "http://93.184.216.34/",
    "ftp://public.test/",
    "HTTP://public.test/",
]

INVALID = [
    "",
    "public.test/hook",
    "//public.test/hook",
    "https:/public.test",
    "https://",
    "https:///path",
    "https://public.test:0/",
    "https://public.test:99999/",
    "https://pub lic.test/",
    "https://public.test\\@127.0.0.1/",
    "https://public.test/\n",
    "https://ｐｕｂｌｉｃ.test/",
    "https://１２７.０.０.１/",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "gopher://127.0.0.1:70/",
    "data:text/plain,hi",
]


def test_corpus_is_large() -> None:
    assert len(NOT_PUBLIC) + len(NOT_HTTPS) + len(INVALID) >= 60


@pytest.mark.parametrize("url", NOT_PUBLIC)
async def test_not_public_refused(policy: AddressPolicy, url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(url)
    assert info.value.message.removesuffix(DEV_MODE_HINT) == MSG_NOT_PUBLIC
    assert [(e.field, e.message) for e in info.value.errors] == [("webhook_url", MSG_NOT_PUBLIC)]
    assert info.value.status_code == 400


@pytest.mark.parametrize("url", NOT_HTTPS)
async def test_plain_http_refused(policy: AddressPolicy, url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(url)
    assert info.value.message in {MSG_NOT_HTTPS, MSG_INVALID}
    if url.lower().startswith("http:"):
        assert info.value.message.removesuffix(DEV_MODE_HINT) == MSG_NOT_HTTPS


@pytest.mark.parametrize("url", INVALID)
async def test_malformed_refused(policy: AddressPolicy, url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(url)
    assert info.value.message.removesuffix(DEV_MODE_HINT) in {
        MSG_INVALID,
        MSG_NOT_PUBLIC,
        MSG_NOT_HTTPS,
    }


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:4242/hook", "http://[::1]/", "http://rebind.test/", "http://u@x.test/"],
)
async def test_refusal_names_every_reason(policy: AddressPolicy, url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(url)
    hint = DEV_MODE_HINT if "[" in url or "127.0.0.1" in url else ""
    assert info.value.message == f"{MSG_NOT_HTTPS}; {MSG_NOT_PUBLIC}{hint}"
    assert [(e.field, e.message) for e in info.value.errors] == [
        ("webhook_url", MSG_NOT_HTTPS),
        ("webhook_url", MSG_NOT_PUBLIC),
    ]


@pytest.mark.parametrize(
    ("url", "hinted"),
    [
        ("http://127.0.0.1:4242/hook", True),
        ("http://mixed.test/", False),
        ("https://192.168.0.1/", True),
        ("http://[::1]:4242/", True),
        # Names are not resolved a second time for the hint.
        ("http://private.test/", False),
        # What serve --dev refuses too: no hint that would not help.
        ("http://public.test/", False),
        ("https://169.254.169.254/latest/meta-data/", False),
        ("http://metadata.test/", False),
        ("http://unknown.test/", False),
    ],
)
async def test_refusal_points_at_serve_dev_only_when_it_would_accept(
    policy: AddressPolicy, url: str, hinted: bool
) -> None:
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(url)
    assert info.value.message.endswith(DEV_MODE_HINT) is hinted
    assert "genhook serve --dev" in DEV_MODE_HINT
    assert all("--dev" not in e.message for e in info.value.errors)


async def test_length_limit(policy: AddressPolicy) -> None:
    base = "https://public.test/"
    exact = base + "a" * (1024 - len(base))
    await policy.check_webhook_url(exact)
    with pytest.raises(InvalidRequest) as info:
        await policy.check_webhook_url(exact + "a")
    assert info.value.message == MSG_TOO_LONG
    assert "1024-character limit" in MSG_TOO_LONG


@pytest.mark.parametrize(
    "url",
    [
        "https://public.test/hook",
        "https://PUBLIC.test/hook?x=1#frag",
        "https://public6.test:8443/",
        f"https://{PUBLIC_V4}/hook",
        f"https://[{PUBLIC_V6}]/hook",
        "https://[64:ff9b::808:808]/",
        "https://[2002:808:808::1]/",
    ],
)
async def test_public_accepted(policy: AddressPolicy, url: str) -> None:
    await policy.check_webhook_url(url)


async def test_every_resolved_address_must_be_public() -> None:
    resolver = MapResolver({"a.test": [PUBLIC_V4, PUBLIC_V6, "fd12::1"]})
    with pytest.raises(InvalidRequest):
        await AddressPolicy(resolver=resolver).check_webhook_url("https://a.test/")
    assert resolver.calls == ["a.test"]


async def test_allow_private_lets_private_and_http_through() -> None:
    policy = AddressPolicy(allow_private=True, resolver=MapResolver(TABLE))
    for url in [
        "https://127.0.0.1/",
        "http://127.0.0.1:8080/",
        "http://[::1]/",
        "http://rebind.test/",
        "http://private.test/",
        "https://ula.test/",
        "https://mixed.test/",
    ]:
        await policy.check_webhook_url(url)
    # A public host still needs https, and never-targets stay refused.
    for url, message in [
        ("http://public.test/", MSG_NOT_HTTPS),
        ("http://mixed.test/", MSG_NOT_HTTPS),
        ("https://metadata.test/", MSG_NOT_PUBLIC),
        ("https://0.0.0.0/", MSG_NOT_PUBLIC),
        ("https://[ff02::1]/", MSG_NOT_PUBLIC),
        ("https://2130706433/", MSG_NOT_PUBLIC),
        ("http://unknown.test/", MSG_NOT_PUBLIC),
    ]:
        with pytest.raises(InvalidRequest) as info:
            await policy.check_webhook_url(url)
        assert info.value.message == message, url


async def test_resolve_checked_pins_checked_addresses() -> None:
    policy = AddressPolicy(resolver=MapResolver(TABLE))
    assert await policy.resolve_checked("public.test", 443) == [PUBLIC_V4]
    with pytest.raises(AddressRefused):
        await policy.resolve_checked("rebind.test", 443)
    private = AddressPolicy(allow_private=True, resolver=MapResolver(TABLE))
    with pytest.raises(AddressRefused):
        await private.resolve_checked("public.test", 80, require_private=True)
    assert await private.resolve_checked("rebind.test", 80, require_private=True) == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("address", "reach"),
    [
        ("8.8.8.8", Reach.PUBLIC),
        ("1.1.1.1", Reach.PUBLIC),
        ("127.0.0.1", Reach.PRIVATE),
        ("10.1.2.3", Reach.PRIVATE),
        ("100.64.0.1", Reach.PRIVATE),
        ("169.254.1.1", Reach.BLOCKED),
        ("224.0.0.251", Reach.BLOCKED),
        ("::ffff:8.8.8.8", Reach.PUBLIC),
        ("::ffff:192.168.0.1", Reach.PRIVATE),
        ("64:ff9b::8.8.8.8", Reach.PUBLIC),
        ("64:ff9b::169.254.169.254", Reach.BLOCKED),
        ("2002:c0a8:0001::", Reach.PRIVATE),
        ("2001:4860:4860::8888", Reach.PUBLIC),
        ("3fff::1", Reach.BLOCKED),
        ("fd00::1", Reach.PRIVATE),
    ],
)
def test_classify(address: str, reach: Reach) -> None:
    assert classify(ipaddress.ip_address(address)) is reach
