"""FastAPI / Starlette glue. Starlette is imported only when the glue is used, so the SDK
stays importable without the web framework."""

# No ``from __future__ import annotations`` here: FastAPI reads the dependency's
# ``request: Request`` annotation at runtime, and Request is imported lazily below.

from collections.abc import Awaitable, Callable
from typing import Any

from genhook.client._event import WebhookEvent, WebhookVerificationError
from genhook.client._verifier import WebhookVerifier


async def verify_request(verifier: WebhookVerifier, request: Any) -> WebhookEvent:
    """Verify a Starlette ``Request`` on its raw body bytes, before any JSON parsing."""
    body = await request.body()
    return await verifier.averify(request.headers, body)


def webhook_dependency(
    verifier: WebhookVerifier, *, status_code: int = 400
) -> Callable[..., Awaitable[WebhookEvent]]:
    """A FastAPI dependency yielding the verified ``WebhookEvent``.

    A refused delivery becomes ``HTTPException(status_code)`` whose detail starts with the
    machine-readable reason, so the service sees a non-2xx and the handler never runs.
    """
    from starlette.exceptions import HTTPException
    from starlette.requests import Request

    async def verified_webhook(request: Request) -> WebhookEvent:
        try:
            return await verify_request(verifier, request)
        except WebhookVerificationError as exc:
            raise HTTPException(status_code=status_code, detail=str(exc)) from exc

    return verified_webhook
