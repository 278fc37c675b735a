"""``genhook accounts list`` on SQLite and PostgreSQL: the command reads through
``genhook.accounts`` and shows every account."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from genhook.accounts import authenticate_caller, create_account
from genhook.cli import app
from genhook.config import Settings
from genhook.db import Database


async def test_accounts_list_shows_every_account(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await create_account(db, "first")
    second = await create_account(db, "second")
    monkeypatch.setenv("GENHOOK_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(settings.data_dir))
    result = await asyncio.to_thread(CliRunner().invoke, app, ["accounts", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = sorted(json.loads(result.output), key=lambda row: str(row["name"]))
    assert listed == [
        {"account_id": first.account_id, "name": "first"},
        {"account_id": second.account_id, "name": "second"},
    ]


async def test_keys_create_with_a_priority_bound(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = await create_account(db, "owner")
    monkeypatch.setenv("GENHOOK_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(settings.data_dir))
    command = ["keys", "create", owner.account_id, "--max-priority", "normal", "--json"]
    result = await asyncio.to_thread(CliRunner().invoke, app, command)
    assert result.exit_code == 0, result.output
    created = json.loads(result.output)
    assert created["max_priority"] == "normal"
    caller = await authenticate_caller(db, f"Bearer {created['api_key']}")
    assert (caller.account.id, caller.max_priority) == (owner.account_id, 0)
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["keys", "list", "--account", owner.account_id, "--json"]
    )
    bounds = {row["key_id"]: row["max_priority"] for row in json.loads(result.output)}
    assert bounds[created["key_id"]] == "normal"
    assert sorted(str(b) for b in bounds.values()) == ["None", "normal"]
    bad = ["keys", "create", owner.account_id, "--max-priority", "top"]
    result = await asyncio.to_thread(CliRunner().invoke, app, bad)
    assert result.exit_code == 2 and "--max-priority" in result.output
