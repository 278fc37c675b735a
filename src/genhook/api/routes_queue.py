"""Who is waiting on whom: the caller's own account (``GET /api/v1/queue``) and, for admin
keys, every account with work (``GET /api/v1/admin/queue``), from ``tasks/shares.py``."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.api.routes_admin import ADMIN_RESPONSES, require_admin
from genhook.tasks.shares import AccountShare, Shares, idle_share
from genhook.tasks.views import iso_ms

router = APIRouter(tags=["queue"])


class AccountQueueView(BaseModel):
    account_id: str
    weight: int = Field(description="Its share of the workers relative to others (default 1).")
    waiting: int = Field(description="Tasks waiting for a worker (status created).")
    running: int = Field(description="Tasks a worker runs now (status processing).")
    worker_seconds: float = Field(
        description="Worker time its tasks held in the window (runs still going up to now)."
    )
    usage_share: float = Field(
        description="Its part of all the worker time used in the window, 0 to 1."
    )
    fair_share: float = Field(
        description="Its weight over the weights of every account with work now: the part of "
        "the workers it gets while they all have work (0 when it has none)."
    )


class QueueView(BaseModel):
    window_seconds: int = Field(description="The recent window worker time is measured over.")
    measured_at: str
    accounts: list[AccountQueueView] = Field(
        description="Accounts with work now or worker time in the window, most waiting first."
    )


def _account(share: AccountShare) -> AccountQueueView:
    return AccountQueueView(
        account_id=share.account_id,
        weight=share.weight,
        waiting=share.waiting,
        running=share.running,
        worker_seconds=round(share.worker_seconds, 3),
        usage_share=round(share.usage_share, 4),
        fair_share=round(share.fair_share, 4),
    )


def _view(shares: Shares, accounts: list[AccountShare]) -> QueueView:
    return QueueView(
        window_seconds=shares.window_seconds,
        measured_at=iso_ms(shares.measured_at),
        accounts=[_account(a) for a in accounts],
    )


@router.get(
    "/api/v1/queue",
    response_model=QueueView,
    responses=ERROR_RESPONSES,
    summary="The calling account's tasks waiting and running, weight and recent worker share",
)
async def own_queue(state: StateDep, account: AccountDep) -> QueueView:
    shares = await state.shares.get(state.db)
    own = shares.of(account.id) or await idle_share(state.db, account.id)
    return _view(shares, [own])


@router.get(
    "/api/v1/admin/queue",
    response_model=QueueView,
    responses=ADMIN_RESPONSES,
    tags=["admin"],
    summary="Every account with work: waiting, running, weight and recent worker share",
)
async def admin_queue(state: StateDep, account: AccountDep) -> QueueView:
    require_admin(state, account)
    shares = await state.shares.get(state.db)
    return _view(shares, shares.accounts)
