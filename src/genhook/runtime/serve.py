"""``genhook serve``: the whole service on one machine, under one supervisor.

It migrates the database, seals signing secrets still stored in clear, creates the default
account on an empty database and binds the API's port, then becomes the supervisor
(``genhook.runtime.supervisor``, standard library only) of one api, ``workers`` workers and
``dispatchers`` dispatchers (``genhook.runtime.roles``), child processes that die with it
(see ``genhook.runtime.lifeline``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from pathlib import Path

from genhook.config import Settings
from genhook.files import private_dir, tighten_data
from genhook.runtime.roles import configure_logging
from genhook.runtime.supervisor import exec_supervisor

log = logging.getLogger("genhook")


async def bootstrap(settings: Settings) -> dict[str, str] | None:
    """Seal signing secrets left in clear; on an empty database, create the default account
    and write its secrets to a 0600 file."""
    from sqlalchemy import func, select

    from genhook.accounts import create_account
    from genhook.db import Account, Database
    from genhook.sender.keys import load_encryption_key
    from genhook.sender.secret_box import seal_plaintext_secrets

    db = Database(settings.resolved_database_url)
    encryption_key = load_encryption_key(settings)
    try:
        sealed = await seal_plaintext_secrets(db, encryption_key)
        if sealed:
            log.info("encrypted %d signing secrets stored in clear by an older version", sealed)
        async with db.read() as session:
            count = (await session.execute(select(func.count()).select_from(Account))).scalar_one()
        if count:
            return None
        account = await create_account(db, "default", encryption_key=encryption_key)
    finally:
        await db.dispose()
    credentials = {
        "account_id": account.account_id,
        "api_key": account.api_key,
        "signing_secret": account.signing_secret,
    }
    path = settings.data_dir / "credentials.json"
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(credentials, handle, indent=2)
    return credentials


# -- the supervisor -------------------------------------------------------------------------


def serve_children(settings: Settings) -> list[tuple[str, int]]:
    """The processes ``genhook serve`` runs: one api, the workers, the dispatchers."""
    return (
        [("api", 0)]
        + [("worker", index) for index in range(settings.workers)]
        + [("dispatcher", index) for index in range(settings.dispatchers)]
    )


def listen_socket(settings: Settings) -> socket.socket:
    """The API's listening socket, bound here once and inherited by each API process."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings) -> None:
    """``genhook serve``: everything on one machine, under one supervisor."""
    configure_logging(settings)
    # Everything the service creates (database, WAL, blobs, key file) is its user's alone.
    os.umask(0o077)
    private_dir(settings.data_dir)
    tighten_data(settings)
    from genhook import metrics

    metrics.use_directory(*metrics.serve_directory(settings))  # every child counts there too
    from genhook.db.migrate import upgrade

    upgrade(settings.resolved_database_url)
    credentials = asyncio.run(bootstrap(settings))
    if credentials:
        path = Path(settings.data_dir / "credentials.json").resolve()
        print("Created the default account. Keep these; they are shown once:", flush=True)
        print(f"  API key:        {credentials['api_key']}", flush=True)
        print(f"  signing secret: {credentials['signing_secret']}", flush=True)
        print(f"  (also written to {path}, mode 0600)", flush=True)
    sock = listen_socket(settings)
    # One health port per machine would collide between children: serve's own API process
    # answers /readyz for all of them.
    payload = settings.model_copy(update={"health_port": 0}).model_dump_json().encode()
    exec_supervisor(
        settings.data_dir,
        serve_children(settings),
        payload,
        listen_fd=sock.fileno(),
        grace=settings.shutdown_grace_seconds,
        log_level=settings.log_level,
        log_format=settings.log_format,
    )
