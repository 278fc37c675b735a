"""Entry point of the service's child processes: ``python -m genhook.runtime.lifeline PARENT ROLE
INDEX [FD]`` runs role ``ROLE`` (api, worker or dispatcher) number ``INDEX`` for the
supervisor ``PARENT``; ``FD`` is the API's inherited listening socket. ``python -m
genhook.runtime.lifeline PARENT release tasks|deliveries OWNER lost|stopped`` gives back what a dead
child held, and exits.

A child must never outlive its supervisor, whatever the moment the supervisor dies. So the
very first thing this module does, before importing anything slow, is ask the kernel to
signal it when its parent dies (``PR_SET_PDEATHSIG``); then it checks that the parent is
still the one that started it, which closes the window before that request took effect.
Only then does a child read its settings (one line of JSON on standard input) and import the
service; a dispatcher goes on reading its standard input for what to give back when a
sibling dies (``genhook.runtime.supervisor.RELEASE``).
"""

from __future__ import annotations

import os
import signal
import sys

# Sent by the kernel when the parent dies. Until the child installs its handler the default
# action ends the process at once; afterwards the role leaves in its own way.
ORPHAN_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Arrange for ``ORPHAN_SIGNAL`` when the parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(ORPHAN_SIGNAL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def main() -> None:
    parent = int(sys.argv[1])
    die_with_parent(parent)
    role = sys.argv[2]
    # One line, read unbuffered: what follows it on a dispatcher's input is read by the role.
    with os.fdopen(0, "rb", buffering=0, closefd=False) as stdin:
        payload = stdin.readline()
    from genhook.config import Settings
    from genhook.runtime import roles as server

    settings = Settings.model_validate_json(payload)
    if role == "release":
        server.release_main(settings, sys.argv[3], sys.argv[4], lost=sys.argv[5] == "lost")
        return
    index = int(sys.argv[3])
    if role == "api":
        fd = int(sys.argv[4]) if len(sys.argv) > 4 else None
        server.api_main(settings, parent=parent, fd=fd)
    elif role == "dispatcher":
        server.dispatcher_main(settings, index, parent=parent)
    elif role == "worker":
        server.worker_main(settings, index, parent=parent)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
