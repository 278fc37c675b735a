"""A verified webhook delivery, typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from genhook.client._models import Prediction


class VerificationFailure(StrEnum):
    """Machine-readable reasons a delivery was refused; stable, safe to log and branch on."""

    MISSING_HEADER = "missing_header"
    INVALID_TIMESTAMP = "invalid_timestamp"
    TIMESTAMP_OUT_OF_TOLERANCE = "timestamp_out_of_tolerance"
    NO_USABLE_SIGNATURE = "no_usable_signature"
    MALFORMED_SIGNATURE = "malformed_signature"
    UNKNOWN_KEY = "unknown_key"
    KEYS_UNAVAILABLE = "keys_unavailable"
    BAD_SIGNATURE = "bad_signature"
    INVALID_BODY = "invalid_body"
    ID_MISMATCH = "id_mismatch"
    EVENT_MISMATCH = "event_mismatch"


class WebhookVerificationError(Exception):
    """The one exception a refused delivery raises; ``reason`` says why."""

    def __init__(self, reason: VerificationFailure, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


Scheme = Literal["ed25519", "hmac"]


@dataclass(frozen=True)
class WebhookEvent:
    """A delivery whose signature, timestamp and id checked out.

    ``payload`` is the task in the result endpoint's shape, built on first access so a
    receiver that only enqueues the event pays nothing for it. ``scheme`` and ``key_id`` say
    which signature was verified; ``timestamp`` is the signed delivery time (epoch seconds).
    """

    session_id: str
    event_type: str
    status: str
    scheme: Scheme
    key_id: str | None
    timestamp: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when ``status`` is ``OK``: ``payload.outputs`` holds a usable result."""
        return self.status == "OK"

    @property
    def task_id(self) -> str:
        return self.session_id

    @property
    def created_at(self) -> int | None:
        """Task creation time, epoch milliseconds."""
        value = self.raw.get("created_at")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def error(self) -> str | None:
        """Why the task failed or timed out; only when ``status`` is ``ERROR``."""
        value = self.raw.get("error")
        return value if isinstance(value, str) else None

    @cached_property
    def payload(self) -> Prediction:
        payload = self.raw.get("payload")
        return Prediction.from_json(
            payload if isinstance(payload, dict) else {}, default_id=self.session_id
        )

    @classmethod
    def from_body(
        cls,
        body: dict[str, Any],
        *,
        scheme: Scheme,
        key_id: str | None,
        timestamp: int,
    ) -> WebhookEvent:
        return cls(
            session_id=str(body.get("session_id", "")),
            event_type=str(body.get("event_type", "")),
            status=str(body.get("status", "")),
            scheme=scheme,
            key_id=key_id,
            timestamp=timestamp,
            raw=body,
        )
