"""``genhook cancel`` (client side, SDK only) and ``genhook accounts limits`` (operator side)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.console import Console

from genhook.cli.client_cmds import (
    API_KEY,
    AS_JSON,
    BASE_URL,
    open_client,
    print_prediction,
)
from genhook.client import GenhookError

console = Console(highlight=False)


def register(app: typer.Typer, accounts_app: typer.Typer) -> None:
    app.command("cancel")(cancel)
    accounts_app.command("limits")(limits)


def cancel(
    task_id: str = typer.Argument(..., help="The task id."),
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
) -> None:
    """Cancel a task that has not ended; exit 3 if it already had (HTTP 409) or is unknown."""
    with open_client(api_key, base_url) as client:
        prediction = client.cancel(task_id)
    print_prediction(prediction, as_json)


def limits(
    account: str = typer.Argument(..., help="Account id or name."),
    per_second: float | None = typer.Option(
        None, "--per-second", min=0, help="Submits per second (token bucket); 0: unlimited."
    ),
    burst: int | None = typer.Option(
        None, "--burst", min=0, help="Submits at once after a quiet spell; 0: one second's worth."
    ),
    in_flight: int | None = typer.Option(
        None, "--in-flight", min=0, help="Tasks created or processing at once; 0: unlimited."
    ),
    weight: int | None = typer.Option(
        None,
        "--weight",
        min=1,
        help="Share of the workers against other accounts' (fair scheduling); default 1.",
    ),
    clear: bool = typer.Option(False, "--clear", help="Drop the overrides; the settings apply."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show or override an account's submit limits and weight (no option: show them)."""
    from genhook.accounts import find_account
    from genhook.cli._environment import load_settings
    from genhook.db import Database
    from genhook.db.migrate import upgrade_in_thread
    from genhook.tasks.admission import effective_limits, set_account_limits

    settings = load_settings()

    async def main() -> dict[str, Any]:
        upgrade_in_thread(settings.resolved_database_url)
        db = Database(settings.resolved_database_url)
        try:
            account_id = (await find_account(db, account)).id
            row = await set_account_limits(
                db,
                account_id,
                per_second=per_second,
                burst=burst,
                in_flight=in_flight,
                clear=clear,
                weight=weight,
            )
        finally:
            await db.dispose()
        effective = effective_limits(settings, row)
        return {
            "account_id": account_id,
            "overrides": {
                "per_second": row.submits_per_second,
                "burst": row.submit_burst,
                "in_flight": row.max_in_flight,
                "weight": row.weight,
            },
            "effective": {
                "per_second": effective.per_second,
                "burst": effective.burst,
                "in_flight": effective.in_flight,
                "weight": effective.weight,
            },
        }

    try:
        view = asyncio.run(main())
    except GenhookError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(view))
        return
    console.print(f"account {view['account_id']} (0 means unlimited)")
    labels = {
        "per_second": "submits per second",
        "burst": "burst",
        "in_flight": "tasks in flight",
        "weight": "weight",
    }
    for name, label in labels.items():
        unset = "default" if name == "weight" else "setting"
        source = unset if view["overrides"][name] is None else "override"
        console.print(f"  {label + ':':20} {view['effective'][name]:g} ({source})")
