"""Upstream provider engine: genhook models served by hosted or self-hosted model servers.

See ``docs/engines/upstream.md``. The engine itself (aiohttp) loads on first use: the API
imports this package for upstream callbacks whether or not any upstream model is configured.
"""

from typing import TYPE_CHECKING

from genhook.engines.upstream._callbacks import callback_waiting, store_callback
from genhook.engines.upstream._config import QueueProtocol, UpstreamModel, load_upstream_models
from genhook.lazy import lazy_names as _lazy_names

if TYPE_CHECKING:
    from genhook.engines.upstream._engine import (
        OptionalImagesRequest,
        UpstreamEngine,
        register_upstream_models,
        upstream_spec,
    )

__getattr__ = _lazy_names(
    __name__,
    dict.fromkeys(
        ("OptionalImagesRequest", "UpstreamEngine", "register_upstream_models", "upstream_spec"),
        "_engine",
    ),
)


__all__ = [
    "OptionalImagesRequest",
    "QueueProtocol",
    "UpstreamEngine",
    "UpstreamModel",
    "callback_waiting",
    "load_upstream_models",
    "register_upstream_models",
    "store_callback",
    "upstream_spec",
]
