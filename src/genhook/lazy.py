"""Names a package exports but loads on first use, so a process that never touches them
(an API without upstream models, a worker without URL inputs) never imports what they
bring (aiohttp)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``names`` maps each lazy name to the
    submodule (relative to ``package``) that defines it."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
