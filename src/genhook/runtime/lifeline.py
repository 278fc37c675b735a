"""Entry point of the service's child processes, and how any child of ours dies with its
parent.

``python -m genhook.runtime.lifeline PARENT LIFELINE ROLE INDEX [FD]`` runs role ``ROLE`` (api,
worker or dispatcher) number ``INDEX`` for the supervisor ``PARENT``; ``LIFELINE`` is the
descriptor of the supervisor's lifeline (``die_with_parent``), ``FD`` the API's inherited
listening socket. ``python -m genhook.runtime.lifeline PARENT LIFELINE release
tasks|deliveries OWNER lost|stopped`` gives back what a dead child held, and exits.

A child must never outlive its parent, whatever the moment the parent dies and however
(``SIGKILL`` included). So the very first thing this module does, before importing anything
slow, is watch its lifeline. Only then does a child read its settings (one line of JSON on
standard input) and import the service; a dispatcher goes on reading its standard input for
what to give back when a sibling dies (``genhook.runtime.supervisor.RELEASE``). A worker's
model process (``genhook.engines.local._host``) watches a lifeline of its worker the same
way.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading

# What a child sends itself when its parent dies. Until the child installs its handler the
# default action ends the process at once; afterwards the role leaves in its own way.
ORPHAN_SIGNAL = signal.SIGUSR1
# How often the watch also compares the parent's id (see ``die_with_parent``).
PARENT_CHECK_SECONDS = 1.0


def die_with_parent(parent: int, fd: int) -> None:
    """Send this process ``ORPHAN_SIGNAL`` as soon as its parent ``parent`` dies.

    ``fd`` is the read end of the parent's lifeline: a pipe whose write end only the parent
    holds and to which nothing is ever written. The kernel closes that end when the parent
    dies, however it dies, which ends a thread's wait here at once (a wait in the kernel,
    without the interpreter's lock, so a busy process does not delay it); a parent dead
    before the wait began left it closed already. The parent's id is also compared once a
    second, for a parent that forked a child which still holds the write end.

    Why not the kernel's parent-death signal (``PR_SET_PDEATHSIG``): it fires when the
    *thread* that started the child ends, and a worker starts its model process from a pool
    thread; it exists on Linux only; and it needs a check of the parent's id to close the
    window before it takes effect. Why not polling the parent's id alone: it once let a
    model process outlive its worker by 1.56 s."""

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        with contextlib.suppress(OSError):
            while os.getppid() == parent:
                if poller.poll(PARENT_CHECK_SECONDS * 1000) and not os.read(fd, 1):
                    break  # end of file: the parent's end closed
        os.kill(os.getpid(), ORPHAN_SIGNAL)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def main() -> None:
    parent = int(sys.argv[1])
    die_with_parent(parent, int(sys.argv[2]))
    role, *rest = sys.argv[3:]
    # One line, read unbuffered: what follows it on a dispatcher's input is read by the role.
    with os.fdopen(0, "rb", buffering=0, closefd=False) as stdin:
        payload = stdin.readline()
    from genhook.config import Settings
    from genhook.runtime import roles as server

    settings = Settings.model_validate_json(payload)
    if role == "release":
        what, owner, how = rest
        server.release_main(settings, what, owner, lost=how == "lost")
        return
    index = int(rest[0])
    if role == "api":
        fd = int(rest[1]) if len(rest) > 1 else None
        server.api_main(settings, parent=parent, fd=fd)
    elif role == "dispatcher":
        server.dispatcher_main(settings, index, parent=parent)
    elif role == "worker":
        server.worker_main(settings, index, parent=parent)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
