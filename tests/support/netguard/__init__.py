"""Keeps the test run on this machine: name lookups answer only for loopback names and IP
literals, and connections go only to loopback addresses.

Installed for the test process by ``tests/conftest.py`` and for every service the tests
start through ``sitecustomize`` (this folder is on their ``PYTHONPATH``). A test that needs a
"public" host injects its own resolver, as the webhook tests do.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
ENV_FLAG = "GENHOOK_TEST_NETGUARD"
_installed = False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _is_loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # Unix sockets
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is None or _is_ip(str(name)) or str(name).lower() in LOOPBACK_NAMES:
            return real_getaddrinfo(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, f"name lookups are disabled in tests: {name}")

    def connect(self: socket.socket, address: Any) -> None:
        if not _is_loopback(address):
            raise ConnectionRefusedError(f"tests connect only to loopback, not {address!r}")
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not _is_loopback(address):
            raise ConnectionRefusedError(f"tests connect only to loopback, not {address!r}")
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    os.environ[ENV_FLAG] = "1"
