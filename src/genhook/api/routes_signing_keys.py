"""Where webhook signing-key rotation stands: every key's status and dates, public parts only.

The JWKS lists the keys a receiver may verify with; this says which one signs now, which are
rotated out and when each stops being published, so an operator can see a rotation through.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.sender.keys import list_signing_keys
from genhook.tasks.views import iso_ms

router = APIRouter(tags=["webhooks"])


class SigningKeyView(BaseModel):
    kid: str
    status: str = Field(description="active (signs now), rotated (still published) or retired.")
    published: bool = Field(description="Whether the JWKS lists it now.")
    created_at: str
    rotated_at: str | None
    retire_at: str | None = Field(description="When a rotated key leaves the JWKS.")


class SigningState(BaseModel):
    mode: str = Field(description="GENHOOK_WEBHOOK_SIGNING: migration or ed25519.")
    overlap_days: float = Field(description="How long a rotated key stays published.")
    keys: list[SigningKeyView]


@router.get(
    "/api/v1/webhooks/signing-keys",
    response_model=SigningState,
    responses=ERROR_RESPONSES,
    summary="The webhook signing keys and their rotation state (public parts only)",
)
async def get_signing_keys(state: StateDep, account: AccountDep) -> SigningState:
    keys = await list_signing_keys(state.db)
    return SigningState(
        mode=state.settings.webhook_signing,
        overlap_days=state.settings.webhook_key_overlap_days,
        keys=[
            SigningKeyView(
                kid=key.kid,
                status=key.status,
                published=key.published,
                created_at=iso_ms(key.created_at),
                rotated_at=iso_ms(key.rotated_at) if key.rotated_at is not None else None,
                retire_at=iso_ms(key.retire_at) if key.retire_at is not None else None,
            )
            for key in reversed(keys)
        ],
    )
