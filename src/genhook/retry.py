"""Exponential backoff with jitter, and ``Retry-After`` parsing: one policy for the project.

The webhook dispatcher and the SDK client both use it, so this module imports only the
standard library.

``backoff_delay(n, base, cap)`` is ``base * 2**(n-1)`` capped at ``cap``, then spread by
``jitter`` (a fraction: 0.2 gives a delay uniformly within +-20%, never above ``cap``), so
receivers recovering from an outage are not hit by every sender at the same instant.
"""

from __future__ import annotations

import email.utils
import random
from datetime import UTC, datetime

DEFAULT_JITTER = 0.2


def backoff_delay(
    attempt: int,
    base: float,
    cap: float,
    *,
    jitter: float = DEFAULT_JITTER,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based) before the next.

    Attempt 1 waits about ``base``, attempt 2 about ``2 * base``, and so on up to ``cap``.
    """
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    if not 0 <= jitter <= 1:
        raise ValueError("jitter is a fraction between 0 and 1")
    # Bounded exponent: 2**64 seconds is beyond any cap, and keeps the float finite.
    delay = min(cap, base * 2.0 ** min(attempt - 1, 64))
    if jitter:
        spread = (rng or random).uniform(-jitter, jitter)
        delay = min(cap, delay * (1.0 + spread))
    return max(0.0, delay)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from an HTTP ``Retry-After`` value (delta-seconds or HTTP-date), or None.

    Unparseable values give None; dates in the past give 0.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    moment = now or datetime.now(UTC)
    return max(0.0, (when - moment).total_seconds())


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
