"""Every account's tasks and webhook deliveries, for the keys of admin accounts.

An account is an admin when its id is in ``GENHOOK_ADMIN_ACCOUNTS``: a deployment setting, not
something a key can grant itself. Other keys get 403.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from genhook.api.deps import AccountDep, AppState, StateDep, current_account, get_state
from genhook.api.errors import ERROR_RESPONSES, ErrorResponse
from genhook.api.routes_watch import task_listing
from genhook.db import Account
from genhook.errors import Forbidden
from genhook.sender.deliveries import MAX_PAGE, DeliveryPage, list_deliveries
from genhook.sender.destinations import DestinationList, list_destinations
from genhook.statuses import DeliveryStatus

router = APIRouter(tags=["admin"])

# A key of an account that is not an admin is answered 403, which the schema says.
ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    403: {"model": ErrorResponse, "description": "The key's account is not an admin account."},
}


def require_admin(state: AppState, account: Account) -> None:
    if account.id not in state.settings.admin_accounts:
        raise Forbidden("this endpoint is for the keys of admin accounts (GENHOOK_ADMIN_ACCOUNTS)")


@router.get(
    "/api/v1/admin/results",
    responses=ADMIN_RESPONSES,
    summary="Every account's tasks, newest first; the filters of /api/v1/model/results and account",
)
async def admin_results(request: Request) -> JSONResponse:
    state = await get_state(request)
    require_admin(state, await current_account(request, state))
    return await task_listing(state, request.query_params, None)


@router.get(
    "/api/v1/admin/deliveries",
    response_model=DeliveryPage,
    responses=ADMIN_RESPONSES,
    summary="Every account's webhook deliveries, newest first, with their attempt log",
)
async def admin_deliveries(
    state: StateDep,
    account: AccountDep,
    status: DeliveryStatus | None = Query(None),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    before: str | None = Query(None, description="The next_before of the previous page."),
) -> DeliveryPage:
    require_admin(state, account)
    return await list_deliveries(
        state.db, account_id=None, status=status, limit=limit, before=before
    )


@router.get(
    "/api/v1/admin/destinations",
    response_model=DestinationList,
    responses=ADMIN_RESPONSES,
    summary="Every account's webhook hosts and endpoints with their circuit state",
)
async def admin_destinations(state: StateDep, account: AccountDep) -> DestinationList:
    require_admin(state, account)
    return await list_destinations(state.db, account_id=None)
