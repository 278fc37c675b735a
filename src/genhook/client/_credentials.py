"""Where a client on the service's own machine finds its API key.

``genhook serve`` writes the default account's key to ``credentials.json`` in its data
directory; the CLI and ``Client()`` both look there (and only for a service on this machine),
so a newcomer next to ``make serve`` needs no key in hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DEFAULT_BASE_URL = "http://127.0.0.1:8000"

# Said by every error about a missing or refused key, so the fix is one read away.
MISSING_KEY_HINT = (
    "pass api_key=... (on the CLI --api-key) or set GENHOOK_API_KEY; next to `genhook serve`, "
    "the key in its genhook-data/credentials.json is found by itself (or set GENHOOK_DATA_DIR "
    "to its data directory)"
)


def local_credentials(base_url: str | None) -> tuple[dict[str, Any], Path] | None:
    """The credentials ``genhook serve`` wrote for its default account, when they apply.

    Looked up only for a service on this machine: ``$GENHOOK_DATA_DIR/credentials.json``,
    else ``./genhook-data/credentials.json`` (the embedded default).
    """
    host = httpx.URL(base_url or DEFAULT_BASE_URL).host
    if host not in LOCAL_HOSTS:
        return None
    data_dir = Path(os.environ.get("GENHOOK_DATA_DIR") or "genhook-data")
    path = data_dir / "credentials.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("api_key"), str):
        return None
    return data, path.resolve()
