"""Upstream provider engine: genhook models served by hosted or self-hosted model servers.

See ``docs/engines/upstream.md``.
"""

from genhook.engines.upstream._callbacks import store_callback
from genhook.engines.upstream._config import QueueProtocol, UpstreamModel, load_upstream_models
from genhook.engines.upstream._engine import (
    OptionalImagesRequest,
    UpstreamEngine,
    register_upstream_models,
    upstream_spec,
)

__all__ = [
    "OptionalImagesRequest",
    "QueueProtocol",
    "UpstreamEngine",
    "UpstreamModel",
    "load_upstream_models",
    "register_upstream_models",
    "store_callback",
    "upstream_spec",
]
