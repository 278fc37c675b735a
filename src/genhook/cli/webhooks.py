"""Operator commands for webhook signing keys, deliveries and account signing secrets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from genhook.cli._output import print_table
from genhook.statuses import DeliveryStatus

T = TypeVar("T")

signing_keys_app = typer.Typer(no_args_is_help=True, help="Ed25519 webhook signing keys.")
deliveries_app = typer.Typer(no_args_is_help=True, help="Webhook deliveries and redelivery.")
console = Console()


def _run(func: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run ``func(settings, db)`` against the configured database."""
    from genhook.cli._environment import load_settings
    from genhook.db import Database

    settings = load_settings()

    async def main() -> T:
        db = Database(settings.resolved_database_url)
        try:
            return await func(settings, db)
        finally:
            await db.dispose()

    from genhook.errors import GenhookError

    try:
        return asyncio.run(main())
    except GenhookError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(code=1) from None


def _iso(value: int | None) -> str:
    if value is None:
        return "-"
    from genhook.tasks.views import iso_ms

    return iso_ms(value)


@signing_keys_app.command("rotate")
def rotate_keys() -> None:
    """Create a new active key; the previous one stays published for the overlap period."""
    from genhook.sender.keys import ensure_signing_key, rotate_signing_key

    async def go(settings: Any, db: Any) -> str:
        await ensure_signing_key(db, settings)
        return await rotate_signing_key(db, settings)

    kid = _run(go)
    console.print(f"new active signing key: [bold]{kid}[/bold]")


@signing_keys_app.command("list")
def list_keys(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """All signing keys, with their status and whether the JWKS publishes them."""
    from genhook.sender.keys import list_signing_keys

    async def go(_: Any, db: Any) -> list[Any]:
        return await list_signing_keys(db)

    keys = _run(go)
    if as_json:
        rows = [
            {
                "kid": k.kid,
                "status": k.status,
                "published": k.published,
                "created_at": _iso(k.created_at),
                "rotated_at": _iso(k.rotated_at) if k.rotated_at else None,
                "retire_at": _iso(k.retire_at) if k.retire_at else None,
                "x": k.public_x,
            }
            for k in keys
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("kid", "status", "published", "created", "rotated", "unpublished after")
    for k in keys:
        table.add_row(
            k.kid,
            k.status,
            "yes" if k.published else "no",
            _iso(k.created_at),
            _iso(k.rotated_at),
            _iso(k.retire_at),
        )
    print_table(console, table)


@signing_keys_app.command("retire")
def retire_key(kid: str = typer.Argument(..., help="A rotated key's id.")) -> None:
    """Stop publishing a rotated key now (e.g. a compromised one), before its overlap ends."""
    from genhook.sender.keys import retire_signing_key

    async def go(_: Any, db: Any) -> None:
        await retire_signing_key(db, kid)

    _run(go)
    console.print(f"retired {kid}; it is no longer published")


@deliveries_app.command("list")
def list_deliveries_cmd(
    account: str | None = typer.Option(None, help="Only this account's deliveries."),
    session_id: str | None = typer.Option(None, "--session-id", help="Only this task's."),
    status: str | None = typer.Option(None, help="pending, delivered or undeliverable."),
    limit: int = typer.Option(20, min=1, max=200),
    as_json: bool = typer.Option(False, "--json", help="Print JSON, attempt log included."),
) -> None:
    """Deliveries, newest first."""
    from genhook.sender.deliveries import DeliveryPage, list_deliveries

    async def go(_: Any, db: Any) -> DeliveryPage:
        return await list_deliveries(
            db, account_id=account, session_id=session_id, status=status, limit=limit
        )

    page = _run(go)
    if as_json:
        typer.echo(page.model_dump_json(indent=2))
        return
    table = Table("id", "session_id", "status", "attempts", "last", "url")
    for d in page.data:
        last = str(d.last_status_code or d.last_error or "-")
        table.add_row(d.id, d.session_id, d.status, str(d.attempts), last[:40], d.url)
    print_table(console, table)


@deliveries_app.command("redeliver")
def redeliver_cmd(
    delivery_id: str = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Send a delivery again now with a fresh retry budget (numbering continues)."""
    from genhook.sender.deliveries import DeliveryView, redeliver

    async def go(_: Any, db: Any) -> DeliveryView:
        return await redeliver(db, delivery_id, account_id=None)

    view = _run(go)
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    console.print(f"{view.id} is due now (redelivery {view.redeliveries}, status {view.status})")


@deliveries_app.command("redeliver-all")
def redeliver_all_cmd(
    since: str = typer.Option(..., help="ISO 8601 time: only deliveries created since."),
    account: str | None = typer.Option(None, help="Only this account's deliveries."),
    status: str = typer.Option(DeliveryStatus.UNDELIVERABLE, help="undeliverable or delivered."),
    destination: str | None = typer.Option(None, help="Only this scheme://host:port."),
    limit: int = typer.Option(100, min=1, max=1000),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Redeliver matching deliveries, oldest first (bounded; repeating it is harmless)."""
    from pydantic import ValidationError

    from genhook.sender.deliveries import (
        BulkRedelivery,
        BulkRedeliveryResult,
        redeliver_many,
    )

    try:
        request = BulkRedelivery.model_validate(
            {"status": status, "since": since, "destination": destination, "limit": limit}
        )
    except ValidationError as exc:
        console.print(f"[red]error:[/red] {exc.errors()[0]['msg']}")
        raise typer.Exit(code=2) from None

    async def go(_: Any, db: Any) -> BulkRedeliveryResult:
        return await redeliver_many(db, request, account_id=account)

    result = _run(go)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    more = " (more match: run it again)" if result.more else ""
    console.print(f"{result.redelivered} deliveries are due now{more}")


def standard_webhooks(
    account: str = typer.Argument(..., help="Account id."),
    mode: str = typer.Argument(..., help="on, off, or default (GENHOOK_WEBHOOK_STANDARD_HEADERS)."),
) -> None:
    """Send (or stop sending) Standard Webhooks headers to an account's receivers."""
    from genhook.accounts import update_account

    values = {"on": True, "off": False, "default": None}
    if mode not in values:
        console.print("[red]error:[/red] mode must be on, off or default")
        raise typer.Exit(code=2)

    async def go(_: Any, db: Any) -> None:
        await update_account(db, account, standard_webhooks=values[mode])

    _run(go)
    console.print(f"Standard Webhooks headers for {account}: {mode}")


def rotate_secret(
    account: str = typer.Argument(..., help="Account id."),
) -> None:
    """Replace an account's HMAC signing secret; prints the new secret once.

    HMAC has one signature header, so there is no overlap: receivers that verify HMAC must
    switch to the new secret (or verify Ed25519, which has key overlap) right away.
    """
    from genhook.accounts import new_signing_secret, update_account

    secret = new_signing_secret()

    async def go(settings: Any, db: Any) -> None:
        from genhook.sender.keys import load_encryption_key
        from genhook.sender.secret_box import seal_secret

        sealed = seal_secret(secret, account, load_encryption_key(settings))
        await update_account(db, account, signing_secret=sealed)

    _run(go)
    console.print(f"new signing secret for {account} (shown once): [bold]{secret}[/bold]")
    from genhook.client import standard_secret

    console.print(f"the same secret for Standard Webhooks libraries: {standard_secret(secret)}")
