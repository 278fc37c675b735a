"""One HTTP client for the tests' one-off requests to services on loopback.

``httpx.get`` and ``httpx.post`` build a client, and with it a TLS context, for every call:
about 60 ms of CPU each even for plain HTTP, which in a polling loop takes most of a core
from the service under test. This client keeps no connection between requests (each call
opens its own, as those functions do) but is built once.
"""

from __future__ import annotations

import httpx

HTTP = httpx.Client(timeout=5, limits=httpx.Limits(max_keepalive_connections=0))
