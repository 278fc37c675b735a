"""The TLS context of every outgoing request (webhooks, input images, upstream models), apart
from the aiohttp connector so that making one imports no HTTP client."""

from __future__ import annotations

import os
import ssl


def client_ssl_context(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """System trust store, plus the PEM ``ca_file`` when given (``GENHOOK_WEBHOOK_CA_FILE``);
    always verifies certificates and host names."""
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=os.fspath(ca_file))
    return context
