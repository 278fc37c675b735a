"""Entry point of the service's child processes: ``python -m genhook.lifeline PARENT INDEX``
for worker ``INDEX``, ``python -m genhook.lifeline PARENT MODULE`` for a helper whose
``MODULE.main()`` then runs (the webhook feed helper).

A worker must never outlive its supervisor, whatever the moment the supervisor dies. So the
very first thing this module does, before importing anything slow, is ask the kernel to
signal it when its parent dies (``PR_SET_PDEATHSIG``); then it checks that the parent is
still the one that started it, which closes the window before that request took effect.
Only then does a worker read its settings (JSON on standard input) and import the service.
"""

from __future__ import annotations

import os
import signal
import sys

# Sent by the kernel when the parent dies. Until the worker installs its handler the default
# action ends the process at once; afterwards the worker releases its task and exits.
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


def outlive_parent() -> None:
    """Cancel the parent-death signal, for a helper that from now on ends by itself when its
    parent goes (the webhook feed helper: end of its pipe, after the exchange in hand)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)


def main() -> None:
    parent = int(sys.argv[1])
    die_with_parent(parent)
    if not sys.argv[2].isdigit():
        import importlib

        importlib.import_module(sys.argv[2]).main()
        return
    index = int(sys.argv[2])
    payload = sys.stdin.buffer.read()
    from genhook.config import Settings
    from genhook.server import worker_main

    worker_main(Settings.model_validate_json(payload), index, parent=parent)


if __name__ == "__main__":
    main()
