"""Task states, in one place for the server, the webhook outbox and the SDK.

Dependency-free so the SDK-only install can import it.

created -> processing -> completed | failed | timeout | canceled; processing -> created when
a lease is lost. A terminal state is final.
"""

from __future__ import annotations

CREATED = "created"
PROCESSING = "processing"
COMPLETED = "completed"
FAILED = "failed"
TIMEOUT = "timeout"
CANCELED = "canceled"

# Not yet ended: cancelable, counted as in flight.
ACTIVE: tuple[str, ...] = (CREATED, PROCESSING)
TERMINAL: tuple[str, ...] = (COMPLETED, FAILED, TIMEOUT, CANCELED)
# Terminal without a result: the callback says ``ERROR`` and carries an ``error`` text.
UNSUCCESSFUL: tuple[str, ...] = (FAILED, TIMEOUT, CANCELED)

CANCELED_MESSAGE = "The task was canceled."
NOT_STARTED_MESSAGE = "The task did not start before its start deadline (X-Start-Deadline)."
