"""What a webhook delivery sends: its exact body and its headers.

The body is the stored outbox bytes every attempt sends. The timestamp and signatures are
made fresh for each attempt, so they are named here, not given values; the key that signed
each attempt is in the delivery's attempt log.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.errors import NotFound
from genhook.sender.deliveries import owned_delivery
from genhook.signature import USER_AGENT_TEMPLATE, header_names

router = APIRouter(tags=["webhooks"])

PER_ATTEMPT = "(made for each attempt)"


class DeliveryMessage(BaseModel):
    id: str
    url: str
    headers: dict[str, str] = Field(description="Per-attempt values are described, not given.")
    body: Any = Field(description="The JSON body every attempt sends.")


@router.get(
    "/api/v1/webhooks/deliveries/{delivery_id}/message",
    response_model=DeliveryMessage,
    responses=ERROR_RESPONSES,
    summary="The body and headers a delivery sends",
)
async def get_message(state: StateDep, account: AccountDep, delivery_id: str) -> DeliveryMessage:
    row = await owned_delivery(state.db, delivery_id, account.id)
    if row is None:
        raise NotFound(f"no delivery {delivery_id!r}")
    brand = state.settings.webhook_header_brand
    names = header_names(brand)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT_TEMPLATE.format(brand=brand),
        names["id"]: row.task_id,
        names["event"]: row.event_type,
        names["timestamp"]: PER_ATTEMPT,
        names["signature"]: PER_ATTEMPT,
        names["signature_ed25519"]: PER_ATTEMPT,
        names["key_id"]: PER_ATTEMPT,
    }
    return DeliveryMessage(id=row.id, url=row.url, headers=headers, body=json.loads(row.body))
