"""The account's own API keys: list, create (shown once) and revoke.

Scoped to the caller's account so a key can manage its siblings (and the console can offer
the same), never another account's keys.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from genhook.accounts import create_key, list_keys, revoke_key
from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.errors import NotFound
from genhook.tasks.views import iso_ms

router = APIRouter(tags=["keys"])


class KeyView(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="The first characters of the key, to recognise it.")
    created_at: str
    revoked_at: str | None


class KeyList(BaseModel):
    keys: list[KeyView]


class NewKeyRequest(BaseModel):
    name: str = Field(default="", max_length=100)


class NewKeyView(KeyView):
    api_key: str = Field(description="The key itself; shown this once only.")


@router.get(
    "/api/v1/keys", response_model=KeyList, responses=ERROR_RESPONSES, summary="The account's keys"
)
async def get_keys(state: StateDep, account: AccountDep) -> KeyList:
    rows = await list_keys(state.db, account.id)
    return KeyList(
        keys=[
            KeyView(
                id=row.id,
                name=row.name,
                prefix=row.prefix,
                created_at=iso_ms(row.created_at),
                revoked_at=iso_ms(row.revoked_at) if row.revoked_at is not None else None,
            )
            for row in rows
        ]
    )


@router.post(
    "/api/v1/keys",
    response_model=NewKeyView,
    responses=ERROR_RESPONSES,
    summary="Create a key for this account",
)
async def post_key(state: StateDep, account: AccountDep, body: NewKeyRequest) -> NewKeyView:
    new = await create_key(state.db, account.id, body.name)
    row = next(k for k in await list_keys(state.db, account.id) if k.id == new.key_id)
    return NewKeyView(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        created_at=iso_ms(row.created_at),
        revoked_at=None,
        api_key=new.api_key,
    )


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
