"""Local-weight models: diffusers pipelines from directories on this machine.

See ``docs/engines/local-models.md``. The configuration and wire schemas import no torch;
the engine (torch, diffusers) loads only in a worker that runs one of these models.
"""

from genhook.engines.local._config import (
    FAMILIES,
    LocalModel,
    check_device,
    check_directory,
    load_local_models,
)
from genhook.engines.local._spec import (
    LocalEditRequest,
    LocalTextRequest,
    LocalVideoRequest,
    local_spec,
    register_local_models,
)


def resident_models() -> frozenset[str]:
    """Ids of the local models this worker's model process holds loaded (for affinity)."""
    from genhook.engines.local._host import HOST

    return HOST.loaded if HOST.pid() is not None else frozenset()  # it may have died idle


def resident_adapters() -> dict[str, frozenset[str]]:
    """Per local model, the names of its entry's LoRA adapters this worker's model process
    holds loaded (adapters by URL are not counted: a task names them by URL, not by file)."""
    from genhook.engines.local._host import HOST

    if HOST.pid() is None:
        return {}
    held = {
        model: frozenset(n.removeprefix("entry_") for n in names if n.startswith("entry_"))
        for model, names in HOST.adapters.items()
    }
    return {model: names for model, names in held.items() if names}


__all__ = [
    "FAMILIES",
    "LocalEditRequest",
    "LocalModel",
    "LocalTextRequest",
    "LocalVideoRequest",
    "check_device",
    "check_directory",
    "load_local_models",
    "local_spec",
    "register_local_models",
    "resident_adapters",
    "resident_models",
]
