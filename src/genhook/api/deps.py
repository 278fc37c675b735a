"""Per-application state and the dependencies routes share (state, authenticated account)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from genhook.accounts import AuthCache, Caller, authenticate_caller
from genhook.api.held import HeldRequests
from genhook.db import Account
from genhook.runtime.services import Services
from genhook.tasks import Submitter
from genhook.tasks.shares import RecentShares
from genhook.tasks.watch import TaskWatcher


@dataclass
class AppState(Services):
    def __post_init__(self) -> None:
        self.submitter = Submitter.sharing(self)
        self.auth_cache = AuthCache(self.settings.auth_cache_seconds)
        self.watcher = TaskWatcher(self.db, self.settings.watch_poll_seconds)
        self.shares = RecentShares()
        self.held = HeldRequests(
            self.settings.max_concurrent_requests,
            self.settings.max_held_requests_per_account,
            self.settings.max_held_requests_per_key,
        )


async def get_state(request: Request) -> AppState:
    """Async so FastAPI calls it inline instead of in its thread pool."""
    state: AppState = request.app.state.genhook
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def current_caller(request: Request, state: StateDep) -> Caller:
    """The account and the key's bounds (``max_priority``), for the endpoints that use them."""
    authorization = request.headers.get("authorization")
    return await authenticate_caller(state.db, authorization, state.auth_cache)


async def current_account(request: Request, state: StateDep) -> Account:
    return (await current_caller(request, state)).account


AccountDep = Annotated[Account, Depends(current_account)]
CallerDep = Annotated[Caller, Depends(current_caller)]
