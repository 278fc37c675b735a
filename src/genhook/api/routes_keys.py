"""The account's own API keys: list, create (shown once) and revoke.

Scoped to the caller's account so a key can manage its siblings (and the console can offer
the same), never another account's keys.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from genhook.accounts import create_key, list_keys, revoke_key
from genhook.api.deps import AccountDep, CallerDep, StateDep
from genhook.api.errors import ERROR_RESPONSES, ErrorResponse
from genhook.db import ApiKey
from genhook.errors import FieldError, Forbidden, NotFound
from genhook.priorities import Priority
from genhook.tasks.views import iso_ms

router = APIRouter(tags=["keys"])


PriorityName = Literal["high", "normal", "low"]


class KeyView(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="The first characters of the key, to recognise it.")
    created_at: str
    revoked_at: str | None
    max_priority: PriorityName | None = Field(
        default=None,
        description="The highest task priority the key may ask for; null: any.",
    )


class KeyList(BaseModel):
    keys: list[KeyView]


class NewKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=100)
    max_priority: PriorityName | None = Field(
        default=None,
        description="The highest task priority the new key may ask for. Never above the "
        "calling key's own bound; left out, the new key has the calling key's bound.",
    )


class NewKeyView(KeyView):
    api_key: str = Field(description="The key itself; shown this once only.")


@router.get(
    "/api/v1/keys", response_model=KeyList, responses=ERROR_RESPONSES, summary="The account's keys"
)
async def get_keys(state: StateDep, account: AccountDep) -> KeyList:
    rows = await list_keys(state.db, account.id)
    return KeyList(keys=[KeyView(**_key_fields(row)) for row in rows])


def _key_fields(row: ApiKey) -> dict[str, Any]:
    bound = row.max_priority
    return {
        "id": row.id,
        "name": row.name,
        "prefix": row.prefix,
        "created_at": iso_ms(row.created_at),
        "revoked_at": iso_ms(row.revoked_at) if row.revoked_at is not None else None,
        "max_priority": Priority.of_level(bound) if bound is not None else None,
    }


def new_key_bound(asked: Priority | None, own: int | None) -> int | None:
    """The bound of a key a key creates: never above the creator's own, so a bounded key
    cannot mint itself a way around its bound; left out, the creator's."""
    if asked is None:
        return own
    if own is not None and asked.level > own:
        message = (
            f"max_priority {asked} is above this API key's own bound "
            f"({Priority.of_level(own)}); a key may create keys bounded at or below its own"
        )
        raise Forbidden(message, [FieldError("max_priority", message)])
    return asked.level


@router.post(
    "/api/v1/keys",
    response_model=NewKeyView,
    responses={
        **ERROR_RESPONSES,
        403: {"model": ErrorResponse, "description": "max_priority above the key's own bound."},
    },
    summary="Create a key for this account",
)
async def post_key(state: StateDep, caller: CallerDep, body: NewKeyRequest) -> NewKeyView:
    account = caller.account
    asked = Priority(body.max_priority) if body.max_priority is not None else None
    bound = new_key_bound(asked, caller.max_priority)
    new = await create_key(state.db, account.id, body.name, max_priority=bound)
    row = next(k for k in await list_keys(state.db, account.id) if k.id == new.key_id)
    return NewKeyView(**_key_fields(row), api_key=new.api_key)


@router.post(
    "/api/v1/keys/{key_id}/revoke",
    responses=ERROR_RESPONSES,
    summary="Revoke one of this account's keys (takes effect within the auth cache's time)",
)
async def post_revoke(state: StateDep, account: AccountDep, key_id: str) -> dict[str, str]:
    if key_id not in {k.id for k in await list_keys(state.db, account.id)}:
        raise NotFound(f"no API key {key_id!r}")
    await revoke_key(state.db, key_id)
    state.auth_cache.clear()
    return {"id": key_id, "status": "revoked"}
