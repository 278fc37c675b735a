"""Marks the catalogue's JSON schemas carry for clients, defined once for the server, the SDK
and the CLI. Dependency-free: the engines import it without pulling in the SDK (httpx), and
the SDK-only install imports it without the server."""

from __future__ import annotations

# On a request field that the model accepts but that changes nothing for it (a field of the
# shared request shape that only another engine reads): ``genhook models ID`` lists it apart.
NO_EFFECT = "x-no-effect"
