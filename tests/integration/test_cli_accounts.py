"""``genhook accounts list`` on SQLite and PostgreSQL: the command reads through
``genhook.accounts`` and shows every account."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from genhook.accounts import create_account
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
