"""The target-address policy (SSRF defence) for webhook targets and input-image URLs."""

from genhook.net._addresses import Reach, classify
from genhook.net._connector import PinnedResolver, client_ssl_context, pinned_connector
from genhook.net._fetch import MAX_REDIRECTS, fetch_input_image
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
from genhook.net._urls import MAX_URL_LENGTH, Problem, Target, TargetRefused, parse_target

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
