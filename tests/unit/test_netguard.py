"""The test run's own guard: no name lookup or connection leaves this machine."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_lookups_of_other_names_are_refused() -> None:
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("hooks.example.com", 443)
    assert socket.getaddrinfo("127.0.0.1", 80)
    assert socket.getaddrinfo("localhost", 80)


def test_connections_to_other_addresses_are_refused() -> None:
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("192.0.2.1", 443))  # refused before any packet is sent


def test_child_python_processes_are_guarded() -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.getaddrinfo('hooks.example.com', 443)\n"
        "except socket.gaierror:\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "refused", out.stderr
