"""``genhook tasks`` (the account's tasks, a page at a time) and ``genhook watch`` (a live
view of one task, driven by its event stream). SDK-only, like the other client commands."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from genhook.cli._output import print_table
from genhook.cli.client_cmds import (
    API_KEY,
    AS_JSON,
    BASE_URL,
    EXIT_TASK_FAILED,
    _status_style,
    console,
    open_client,
    print_prediction,
)
from genhook.client import LogLine, Prediction
from genhook.statuses import TaskStatus
from genhook.task_states import POLLED_STATUSES


def register(app: typer.Typer) -> None:
    app.command("tasks")(tasks)
    app.command("watch")(watch)


def tasks(
    status: list[str] = typer.Option(
        [],
        "--status",
        "-s",
        help=f"{', '.join(POLLED_STATUSES)} (failed includes timeout); repeatable.",
    ),
    model: str | None = typer.Option(None, "--model", "-m", help="Only this model's tasks."),
    since: str | None = typer.Option(
        None, "--since", help="Created at or after this ISO 8601 time (e.g. 2026-11-22T00:00Z)."
    ),
    limit: int = typer.Option(20, "--limit", "-n", help="Tasks per page (1 to 100)."),
    cursor: str | None = typer.Option(None, "--cursor", help="next_cursor of an earlier page."),
    every_page: bool = typer.Option(False, "--all", help="Follow the cursor to the last page."),
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
) -> None:
    """List the account's tasks, newest first."""
    table = Table(box=None)
    table.add_column("id", no_wrap=True, min_width=32)
    for name in ("model", "status", "created_at", "completed_at"):
        table.add_column(name, overflow="fold")
    with open_client(api_key, base_url) as client:
        while True:
            page = client.tasks(
                status=status or None, model=model, since=since, limit=limit, cursor=cursor
            )
            if as_json:
                console.print_json(json.dumps(page.raw))
            for item in page.items:
                style = _status_style(item.status)
                table.add_row(
                    item.id,
                    escape(item.model),
                    f"[{style}]{item.status}[/{style}]",
                    item.created_at or "",
                    item.completed_at or "",
                )
            cursor = page.next_cursor
            if cursor is None or not every_page:
                break
    if as_json:
        return
    print_table(console, table)
    if cursor is not None:
        console.print(f"[dim]more: --cursor {cursor}[/dim]")


def render(prediction: Prediction, logs: list[LogLine], elapsed: float) -> Group:
    """The live view of one task: its state, a progress bar while it runs, recent logs."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    style = _status_style(prediction.status)
    table.add_row("task", f"{prediction.id}  [dim]{escape(prediction.model)}[/dim]")
    table.add_row("status", f"[{style}]{prediction.status}[/{style}]  ({elapsed:.1f} s)")
    if prediction.queue_position is not None:
        table.add_row("queue", f"{prediction.queue_position} ahead")
    if prediction.started_at:
        table.add_row("started_at", prediction.started_at)
    parts: list[Table | ProgressBar] = [table]
    if prediction.status == TaskStatus.PROCESSING or prediction.done:
        done = 1.0 if prediction.succeeded else prediction.progress or 0.0
        parts.append(ProgressBar(total=1.0, completed=done, width=40))
    if logs:
        lines = Table(show_header=False, box=None, pad_edge=False)
        lines.add_column(style="dim")
        lines.add_column(overflow="fold")
        for line in logs[-8:]:
            lines.add_row(line.at[11:23], escape(line.message))
        parts.append(lines)
    return Group(*parts)


def watch(
    task_id: str = typer.Argument(..., help="The task id."),
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = typer.Option(False, "--json", help="Print each event as one JSON line."),
) -> None:
    """Follow a task live until it ends; exit 1 if it failed."""
    started = time.monotonic()
    logs: list[LogLine] = []
    final: Prediction | None = None
    with open_client(api_key, base_url) as client:
        if as_json:
            for event in client.events(task_id):
                typer.echo(
                    json.dumps({"id": event.id, "event": event.event, **event.prediction.raw})
                )
                final = event.prediction
        else:
            with Live(console=console, refresh_per_second=8, transient=True) as live:
                for event in client.events(task_id):
                    logs += event.prediction.logs
                    final = event.prediction
                    live.update(render(final, logs, time.monotonic() - started))
    if final is None:
        return
    if not as_json:
        console.print(render(final, logs, time.monotonic() - started))
        print_prediction(final, False)
    if final.status in (TaskStatus.FAILED, TaskStatus.TIMEOUT):
        raise typer.Exit(EXIT_TASK_FAILED)
