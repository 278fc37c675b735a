"""Strict parsing of target URLs, so the host we check is the host the client connects to.

URL parsers disagree on odd input (backslashes, userinfo, percent-encoded or non-ASCII
hosts, numeric IPv4 shorthands such as ``2130706433`` or ``0x7f.1``); such input is
refused outright instead of being interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from yarl import URL

from genhook.net._addresses import IPAddress, parse_ip

MAX_URL_LENGTH = 1024

_SAFE_URL = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_CANONICAL_V4 = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
)


class Problem(Enum):
    TOO_LONG = "too_long"
    INVALID = "invalid"
    SCHEME = "scheme"
    ADDRESS = "address"


class TargetRefused(Exception):
    """A URL the policy refuses; ``problem`` picks the message.

    ``also`` names further problems of the same URL, so a refusal can state every reason
    at once (an ``http://127.0.0.1`` target is both plain http and not public).
    """

    def __init__(self, problem: Problem, detail: str, *, also: tuple[Problem, ...] = ()) -> None:
        super().__init__(detail)
        self.problem = problem
        self.problems = (problem, *also)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Target:
    url: URL
    scheme: str
    # Lower-case host name, or the IP literal's text.
    host: str
    port: int
    ip: IPAddress | None


def parse_target(
    raw: str,
    *,
    schemes: frozenset[str] = frozenset({"http", "https"}),
    max_length: int = MAX_URL_LENGTH,
) -> Target:
    if len(raw) > max_length:
        raise TargetRefused(Problem.TOO_LONG, f"longer than {max_length} characters")
    if not _SAFE_URL.fullmatch(raw):
        raise TargetRefused(Problem.INVALID, "contains characters not allowed in a URL")
    try:
        url = URL(raw)
    except ValueError as exc:
        raise TargetRefused(Problem.INVALID, f"cannot be parsed: {exc}") from None
    scheme = (url.scheme or "").lower()
    if not url.absolute or scheme not in {"http", "https"}:
        raise TargetRefused(Problem.INVALID, "is not an absolute http(s) URL")
    if scheme not in schemes:
        raise TargetRefused(Problem.SCHEME, f"uses {scheme}")
    authority = raw.split("//", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority or url.user is not None or url.password is not None:
        raise TargetRefused(Problem.ADDRESS, "carries credentials")
    raw_host = url.raw_host or ""
    if "%" in authority or not raw_host:
        raise TargetRefused(Problem.ADDRESS, "has no usable host")
    port = url.port
    if port is None or not 0 < port < 65536:
        raise TargetRefused(Problem.INVALID, "has an invalid port")
    if ":" in raw_host:
        ip = parse_ip(raw_host)
        if ip is None:
            raise TargetRefused(Problem.ADDRESS, "has an invalid IPv6 literal")
        return Target(url, scheme, str(ip), port, ip)
    if raw_host.endswith("."):
        # A fully qualified spelling breaks TLS name checks and Host headers downstream;
        # refused here so that what submit accepts, delivery can use.
        raise TargetRefused(Problem.ADDRESS, "has a host name ending in a dot")
    host = raw_host.lower()
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # WHATWG: a host whose last label is numeric is an IPv4 address; only the
        # canonical dotted-quad spelling is accepted.
        if not _CANONICAL_V4.fullmatch(host):
            raise TargetRefused(Problem.ADDRESS, "uses a non-canonical IPv4 spelling")
        ip = parse_ip(host)
        assert ip is not None
        return Target(url, scheme, host, port, ip)
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise TargetRefused(Problem.ADDRESS, "has an invalid host name")
    return Target(url, scheme, host, port, None)
