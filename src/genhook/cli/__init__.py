"""The ``genhook`` command. Server commands import the server lazily, so the SDK-only install
(``pip install genhook``) still runs the client commands."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from genhook.cli._output import print_table
from genhook.priorities import Priority

T = TypeVar("T")

app = typer.Typer(
    no_args_is_help=True, help="genhook: async generation tasks with signed webhooks."
)
accounts_app = typer.Typer(no_args_is_help=True, help="Accounts and their signing secrets.")
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")
console = Console()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _settings(**overrides: Any) -> Any:
    from genhook.cli._environment import load_settings

    return load_settings(**overrides)


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code=1)


def _check_models(settings: Any) -> Any:
    """The models ``settings`` configure (local and upstream entries, batching, preloads),
    checked before a role starts: a bad one is one line naming it, not a traceback in every
    child process of ``genhook serve``."""
    from genhook.engines.registry import build_registry

    try:
        build_registry(settings)
    except ValueError as exc:
        _fail(str(exc))
    return settings


async def _with_db(settings: Any, func: Any) -> Any:
    from genhook.db import Database
    from genhook.db.migrate import upgrade_in_thread

    upgrade_in_thread(settings.resolved_database_url)
    db = Database(settings.resolved_database_url)
    try:
        return await func(db)
    finally:
        await db.dispose()


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Address to listen on (GENHOOK_HOST)."),
    port: int | None = typer.Option(None, help="Port to listen on (GENHOOK_PORT)."),
    workers: int | None = typer.Option(None, help="Worker processes (GENHOOK_WORKERS)."),
    dispatchers: int | None = typer.Option(
        None, help="Dispatcher processes (GENHOOK_DISPATCHERS)."
    ),
    dev: bool = typer.Option(
        False,
        "--dev",
        help="Allow webhooks to loopback and private addresses, for a local receiver.",
    ),
) -> None:
    """Migrate, then run one api, the workers and the dispatchers under one supervisor."""
    from genhook.runtime.serve import serve as run_server

    settings = _settings(
        host=host,
        port=port,
        workers=workers,
        dispatchers=dispatchers,
        webhook_allow_private_targets=dev or None,
    )
    _check_models(settings)
    if dev:
        _print_dev_hint(settings)
    run_server(settings)


def genhook_command() -> str:
    """How another terminal runs this installation's ``genhook``: plain ``genhook`` when the
    shell's PATH finds this one, else the script beside this interpreter (``.venv/bin/genhook``
    from a checkout whose virtualenv is not active), else ``python -m genhook.cli``."""
    script = Path(sys.executable).parent / "genhook"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m genhook.cli"
    found = shutil.which("genhook")
    if found and Path(found).resolve() == script.resolve():
        return "genhook"
    relative = os.path.relpath(script)
    return shlex.quote(relative if not relative.startswith("..") else str(script))


def _print_dev_hint(settings: Any) -> None:
    """How to receive this service's webhooks on this machine (``serve --dev``)."""
    base = settings.resolved_public_base_url
    print(
        "Development mode: webhook_url may be a loopback or private address, over plain http.\n"
        "Receive and verify the callbacks in another terminal with:\n"
        f"  {genhook_command()} listen --base-url {base} --port 4242\n"
        'and submit with "webhook_url": "http://127.0.0.1:4242/hook".',
        flush=True,
    )


_HEALTH_PORT_HELP = "Port for /healthz, /readyz and /metrics; 0 = none (GENHOOK_HEALTH_PORT)."


@app.command()
def api(
    host: str | None = typer.Option(None, help="Address to listen on (GENHOOK_HOST)."),
    port: int | None = typer.Option(None, help="Port to listen on (GENHOOK_PORT)."),
) -> None:
    """Run the HTTP API alone; workers and dispatchers run as their own commands."""
    from genhook.runtime.roles import run_api

    run_api(_check_models(_settings(host=host, port=port)))


@app.command()
def worker(
    concurrency: int | None = typer.Option(
        None,
        min=1,
        help="Tasks at once for engines that wait on I/O (GENHOOK_WORKER_CONCURRENCY).",
    ),
    health_port: int | None = typer.Option(None, min=0, max=65535, help=_HEALTH_PORT_HELP),
    preload: list[str] | None = typer.Option(
        None,
        help="A model to load before the first claim (repeatable; GENHOOK_PRELOAD_MODELS); "
        "the worker reports ready only once they are loaded.",
    ),
    device: str | None = typer.Option(
        None,
        help="The device for local models: cpu, cuda or cuda:N (GENHOOK_LOCAL_MODELS_DEVICE); "
        "run one worker per GPU.",
    ),
    model: list[str] | None = typer.Option(
        None,
        help="Claim only this model's tasks (repeatable; GENHOOK_WORKER_MODELS): a pool of "
        "workers per model group.",
    ),
) -> None:
    """Run one worker process: claims tasks and runs their engines."""
    from genhook.runtime.roles import run_worker

    if device is not None:
        from genhook.engines.local import check_device

        try:
            check_device(device)
        except ValueError as exc:
            _fail(str(exc))
    run_worker(
        _check_models(
            _settings(
                worker_concurrency=concurrency,
                health_port=health_port,
                preload_models=preload or None,
                local_models_device=device,
                worker_models=model or None,
            )
        )
    )


@app.command()
def dispatcher(
    health_port: int | None = typer.Option(None, min=0, max=65535, help=_HEALTH_PORT_HELP),
) -> None:
    """Run one dispatcher process: webhook delivery, reconciliation and lease sweeping."""
    from genhook.runtime.roles import run_dispatcher

    run_dispatcher(_check_models(_settings(health_port=health_port)))


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the database schema to the newest version."""
    from genhook.db.migrate import upgrade
    from genhook.sender.keys import load_encryption_key
    from genhook.sender.secret_box import seal_plaintext_secrets

    settings = _settings()
    upgrade(settings.resolved_database_url)
    key = load_encryption_key(settings)
    sealed = _run(_with_db(settings, lambda db: seal_plaintext_secrets(db, key)))
    if sealed:
        console.print(f"encrypted {sealed} signing secrets stored in clear")
    console.print("database is at the newest schema")


@accounts_app.command("create")
def accounts_create(
    name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Create an account; prints its id, API key and webhook signing secret once."""
    from genhook.accounts import create_account
    from genhook.sender.keys import load_encryption_key

    settings = _settings()
    key = load_encryption_key(settings)
    account = _run(_with_db(settings, lambda db: create_account(db, name, encryption_key=key)))
    if as_json:
        print(
            json.dumps(
                {
                    "account_id": account.account_id,
                    "api_key": account.api_key,
                    "signing_secret": account.signing_secret,
                }
            )
        )
        return
    console.print(f"account id:     {account.account_id}")
    console.print(f"API key:        {account.api_key}")
    console.print(f"signing secret: {account.signing_secret}")
    console.print("[yellow]The key and the secret are shown once; store them now.[/yellow]")


@accounts_app.command("list")
def accounts_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List accounts."""
    from genhook.accounts import list_accounts

    rows = _run(_with_db(_settings(), list_accounts))
    if as_json:
        print(json.dumps([{"account_id": r.id, "name": r.name} for r in rows]))
        return
    table = Table("account id", "name")
    for row in rows:
        table.add_row(row.id, row.name)
    print_table(console, table)


@keys_app.command("create")
def keys_create(
    account: str = typer.Argument(..., help="Account id or name."),
    name: str = typer.Option("", help="A label for the key."),
    max_priority: Priority | None = typer.Option(
        None,
        "--max-priority",
        case_sensitive=False,
        help="The highest task priority the key may ask for (default: any).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create an API key for an account; the key is shown once."""
    from genhook.accounts import create_key
    from genhook.errors import GenhookError

    bound = max_priority.level if max_priority is not None else None
    try:
        key = _run(
            _with_db(_settings(), lambda db: create_key(db, account, name, max_priority=bound))
        )
    except GenhookError as exc:
        _fail(exc.message)
        return
    if as_json:
        print(
            json.dumps(
                {
                    "key_id": key.key_id,
                    "account_id": key.account_id,
                    "api_key": key.api_key,
                    "max_priority": max_priority,
                }
            )
        )
        return
    console.print(f"key id:  {key.key_id}\nAPI key: {key.api_key}")
    if max_priority is not None:
        console.print(f"max priority: {max_priority}")


@keys_app.command("list")
def keys_list(
    account: str | None = typer.Option(None, help="Only this account (id or name)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List API keys (their prefixes only; keys are stored hashed)."""
    from genhook.accounts import list_keys
    from genhook.errors import GenhookError
    from genhook.tasks.views import iso_ms

    try:
        rows = _run(_with_db(_settings(), lambda db: list_keys(db, account)))
    except GenhookError as exc:
        _fail(exc.message)
        return
    items = [
        {
            "key_id": r.id,
            "account_id": r.account_id,
            "name": r.name,
            "prefix": r.prefix,
            "created_at": iso_ms(r.created_at),
            "revoked_at": iso_ms(r.revoked_at) if r.revoked_at else None,
            "max_priority": (
                Priority.of_level(r.max_priority) if r.max_priority is not None else None
            ),
        }
        for r in rows
    ]
    if as_json:
        print(json.dumps(items))
        return
    table = Table("key id", "account", "name", "prefix", "created", "revoked", "max priority")
    for item in items:
        table.add_row(*(str(item[k] or "") for k in item))
    print_table(console, table)


@keys_app.command("revoke")
def keys_revoke(key_id: str) -> None:
    """Revoke an API key; requests with it are refused from then on."""
    from genhook.accounts import revoke_key
    from genhook.errors import GenhookError

    try:
        _run(_with_db(_settings(), lambda db: revoke_key(db, key_id)))
    except GenhookError as exc:
        _fail(exc.message)
        return
    console.print(f"revoked {key_id}")


def _register_command_groups() -> None:
    """Attach the webhook and client command groups, which live in their own modules."""
    from genhook.cli import client_cmds, predict_cmd, task_api_cmds
    from genhook.cli import webhooks as webhook_cli

    app.add_typer(webhook_cli.signing_keys_app, name="signing-keys")
    app.add_typer(webhook_cli.deliveries_app, name="deliveries")
    accounts_app.command("rotate-secret")(webhook_cli.rotate_secret)
    accounts_app.command("standard-webhooks")(webhook_cli.standard_webhooks)
    client_cmds.register(app)
    task_api_cmds.register(app, accounts_app)
    predict_cmd.register(app)


_register_command_groups()


def main() -> None:
    app()
