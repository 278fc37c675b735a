"""Webhook endpoints: the public key set, the attempt log and redelivery."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES, ErrorResponse
from genhook.db import now_ms
from genhook.sender.deliveries import (
    MAX_PAGE,
    BulkRedelivery,
    BulkRedeliveryResult,
    DeliveryPage,
    DeliveryView,
    list_deliveries,
    redeliver,
    redeliver_many,
)
from genhook.sender.destinations import DestinationList, list_destinations
from genhook.sender.keys import jwks, jwks_max_age
from genhook.statuses import DeliveryStatus

router = APIRouter(tags=["webhooks"])


class Jwk(BaseModel):
    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    x: str
    use: Literal["sig"]
    alg: Literal["EdDSA"]
    kid: str


class JwkSet(BaseModel):
    keys: list[Jwk]


@router.get(
    "/api/v1/webhooks/jwks.json",
    response_model=JwkSet,
    summary="Public Ed25519 keys that verify webhook signatures (no authentication)",
)
async def get_jwks(state: StateDep, response: Response) -> JwkSet:
    # Receivers cache the key set for max-age (and fetch it again on an unknown kid), so a
    # retired key stops verifying within that time (docs/webhooks.md).
    moment = now_ms()
    max_age = await jwks_max_age(state.db, now=moment)
    response.headers["Cache-Control"] = f"public, max-age={max_age}"
    return JwkSet.model_validate(await jwks(state.db, now=moment))


@router.get(
    "/api/v1/webhooks/deliveries",
    response_model=DeliveryPage,
    responses=ERROR_RESPONSES,
    summary="Webhook deliveries of this account, newest first, with their attempt log",
)
async def get_deliveries(
    state: StateDep,
    account: AccountDep,
    session_id: str | None = Query(None, description="Only the delivery of this task."),
    status: DeliveryStatus | None = Query(None),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    before: str | None = Query(None, description="The next_before of the previous page."),
) -> DeliveryPage:
    return await list_deliveries(
        state.db,
        account_id=account.id,
        session_id=session_id,
        status=status,
        limit=limit,
        before=before,
    )


@router.post(
    "/api/v1/webhooks/deliveries/{delivery_id}/redeliver",
    response_model=DeliveryView,
    responses={
        **ERROR_RESPONSES,
        409: {"model": ErrorResponse, "description": "An attempt is in flight; retry later."},
    },
    summary="Send a delivery again now, with a fresh retry budget (also when undeliverable)",
)
async def post_redeliver(state: StateDep, account: AccountDep, delivery_id: str) -> DeliveryView:
    return await redeliver(state.db, delivery_id, account_id=account.id)


@router.get(
    "/api/v1/webhooks/destinations",
    response_model=DestinationList,
    responses=ERROR_RESPONSES,
    summary="Health of the destinations this account's webhooks go to (circuit state)",
)
async def get_destinations(state: StateDep, account: AccountDep) -> DestinationList:
    return await list_destinations(state.db, account_id=account.id)


@router.post(
    "/api/v1/webhooks/deliveries/redeliver",
    response_model=BulkRedeliveryResult,
    responses=ERROR_RESPONSES,
    summary="Send this account's matching deliveries again (bounded, idempotent)",
)
async def post_redeliver_many(
    state: StateDep, account: AccountDep, request: BulkRedelivery
) -> BulkRedeliveryResult:
    return await redeliver_many(state.db, request, account_id=account.id)
