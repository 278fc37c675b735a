"""The target-address policy (SSRF defence) for webhook targets and input-image URLs.

The HTTP client side (``_connector``, ``_fetch``) imports aiohttp, so it loads on first use:
a process that only checks addresses (the API, a worker without URL inputs) goes without.
"""

from typing import TYPE_CHECKING

from genhook.lazy import lazy_names as _lazy_names
from genhook.net._addresses import Reach, classify
from genhook.net._policy import (
    MSG_INVALID,
    MSG_NOT_HTTPS,
    MSG_NOT_PUBLIC,
    MSG_TOO_LONG,
    AddressPolicy,
    AddressRefused,
    Resolver,
    SystemResolver,
)
from genhook.net._tls import client_ssl_context
from genhook.net._urls import MAX_URL_LENGTH, Problem, Target, TargetRefused, parse_target

if TYPE_CHECKING:
    from genhook.net._connector import PinnedResolver, pinned_connector
    from genhook.net._fetch import MAX_REDIRECTS, fetch_input_image

__getattr__ = _lazy_names(
    __name__,
    {
        "PinnedResolver": "_connector",
        "pinned_connector": "_connector",
        "MAX_REDIRECTS": "_fetch",
        "fetch_input_image": "_fetch",
    },
)


__all__ = [
    "MAX_REDIRECTS",
    "MAX_URL_LENGTH",
    "MSG_INVALID",
    "MSG_NOT_HTTPS",
    "MSG_NOT_PUBLIC",
    "MSG_TOO_LONG",
    "AddressPolicy",
    "AddressRefused",
    "PinnedResolver",
    "Problem",
    "Reach",
    "Resolver",
    "SystemResolver",
    "Target",
    "TargetRefused",
    "classify",
    "client_ssl_context",
    "fetch_input_image",
    "parse_target",
    "pinned_connector",
]
