"""Which IP addresses a target may have: public, private (development only) or never.

Python's ``is_global`` alone is not enough (it calls multicast global and misses several
special ranges, and it does not look inside IPv6 forms that embed an IPv4 address), so
the ranges are spelled out here, once, for webhook targets and input-image URLs alike.
"""

from __future__ import annotations

import ipaddress
from enum import Enum

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Reach(Enum):
    PUBLIC = "public"
    # Loopback and private ranges: allowed only with ``webhook_allow_private_targets``.
    PRIVATE = "private"
    # Never a target, whatever the settings (unspecified, multicast, link-local, ...).
    BLOCKED = "blocked"


def _nets4(*cidrs: str) -> tuple[ipaddress.IPv4Network, ...]:
    return tuple(ipaddress.IPv4Network(c) for c in cidrs)


def _nets6(*cidrs: str) -> tuple[ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.IPv6Network(c) for c in cidrs)


_V4_PRIVATE = _nets4(
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"
)
_V4_BLOCKED = _nets4(
    "0.0.0.0/8",  # "this network"
    "169.254.0.0/16",  # link-local, cloud metadata services
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # TEST-NET-1
    "192.88.99.0/24",  # 6to4 relay anycast
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # TEST-NET-2
    "203.0.113.0/24",  # TEST-NET-3
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and 255.255.255.255
)
_V6_PRIVATE = _nets6("::1/128", "fc00::/7")
_V6_BLOCKED = _nets6(
    "::/96",  # unspecified and the deprecated IPv4-compatible form
    "64:ff9b:1::/48",  # local-use NAT64
    "100::/64",  # discard
    "2001::/23",  # IETF protocol assignments, Teredo included
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation (RFC 9637)
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_V6_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V6_6TO4 = ipaddress.IPv6Network("2002::/16")


def classify(address: IPAddress) -> Reach:
    """Classify one address; IPv6 wrappers of an IPv4 address are judged by that address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return Reach.BLOCKED
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return _classify_v4(embedded)
        if any(address in net for net in _V6_PRIVATE):
            return Reach.PRIVATE
        if any(address in net for net in _V6_BLOCKED):
            return Reach.BLOCKED
        if address in _V6_GLOBAL_UNICAST and address.is_global:
            return Reach.PUBLIC
        return Reach.BLOCKED
    return _classify_v4(address)


def _classify_v4(address: ipaddress.IPv4Address) -> Reach:
    if any(address in net for net in _V4_BLOCKED):
        return Reach.BLOCKED
    if any(address in net for net in _V4_PRIVATE):
        return Reach.PRIVATE
    return Reach.PUBLIC if address.is_global else Reach.BLOCKED


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 address."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _V6_NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _V6_6TO4:
        return address.sixtofour
    return None


def parse_ip(text: str) -> IPAddress | None:
    """A canonical IP literal, or None; scoped IPv6 (``%zone``) is not an address here."""
    if "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
