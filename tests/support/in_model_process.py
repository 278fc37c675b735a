"""What a test runs inside the worker's model process (``HOST.run(function, ...)``), where the
pipelines live: looking at a call's arguments, and making the device's own failures happen
there (an out-of-memory, a crash)."""

from __future__ import annotations

import os
import signal
import weakref
from pathlib import Path
from typing import Any

from genhook.config import Settings
from genhook.engines.local._config import LocalModel
from genhook.engines.local._residency import RESIDENCY

_prompts: list[Any] = []
_activations: list[weakref.ref[Any]] = []


def record_prompts(model: LocalModel, settings: Settings) -> None:
    """From now on, note each prompt the pipeline encodes."""
    pipe = RESIDENCY.pipeline(model, settings)
    encode = pipe.encode_prompt

    def recorded(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        _prompts.append(prompt)
        return encode(prompt, *args, **kwargs)

    pipe.encode_prompt = recorded


def recorded_prompts() -> list[Any]:
    """The prompts encoded since the last look."""
    prompts = list(_prompts)
    _prompts.clear()
    return prompts


def exhaust_memory(model: LocalModel, settings: Settings) -> None:
    """The device's side of an out-of-memory: the model's forward, holding an activation,
    raises what CUDA would."""
    import torch

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        activation = torch.zeros(1 << 20)
        _activations.append(weakref.ref(activation))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    RESIDENCY.pipeline(model, settings).transformer.forward = exhausted


def exhaust_cpu_memory(model: LocalModel, settings: Settings) -> None:
    """The CPU's out-of-memory: the model's forward asks its allocator for an exabyte."""
    import torch

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        return torch.empty(1 << 60, dtype=torch.uint8)

    RESIDENCY.pipeline(model, settings).transformer.forward = exhausted


def activations_held() -> int:
    """How many of the failed forwards' activations something still holds (no collection:
    what the next call would find taken)."""
    return sum(ref() is not None for ref in _activations)


def crash_in_call(model: LocalModel, settings: Settings) -> None:
    """A native library's crash: the process dies in the middle of the model's forward."""

    def crashed(*args: Any, **kwargs: Any) -> Any:
        os._exit(70)

    RESIDENCY.pipeline(model, settings).transformer.forward = crashed


def killed_in_call(model: LocalModel, settings: Settings) -> None:
    """The kernel's out-of-memory killer: SIGKILL in the middle of the model's forward."""

    def killed(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    RESIDENCY.pipeline(model, settings).transformer.forward = killed


def restore(model: LocalModel, settings: Settings) -> None:
    """The model's own forward again."""
    del RESIDENCY.pipeline(model, settings).transformer.forward


def set_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def threads() -> int:
    import torch

    return torch.get_num_threads()


def slow_steps(model: LocalModel, settings: Settings, seconds: float) -> None:
    """Each denoising step takes ``seconds`` longer, as a large model's do on a card."""
    import time

    pipe = RESIDENCY.pipeline(model, settings)
    forward = pipe.unet.forward

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return forward(*args, **kwargs)

    pipe.unet.forward = slow


def hang_in_call(model: LocalModel, settings: Settings, marker: str) -> None:
    """A hung kernel: the model's forward makes the call's first step, then creates the file
    ``marker`` and never returns."""
    import time

    pipe = RESIDENCY.pipeline(model, settings)
    forward = pipe.unet.forward
    steps: list[None] = []

    def hung(*args: Any, **kwargs: Any) -> Any:
        if steps:
            Path(marker).touch()
            time.sleep(3600)
        steps.append(None)
        return forward(*args, **kwargs)

    pipe.unet.forward = hung


def slow_loads(seconds: float) -> None:
    """From now on each load takes ``seconds`` longer, as a large model's read from disk
    does (0: loads at their own speed again)."""
    import time

    from genhook.engines.local import _residency

    load = getattr(_residency.load_pipeline, "__wrapped__", _residency.load_pipeline)

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return load(*args, **kwargs)

    slow.__wrapped__ = load  # type: ignore[attr-defined]
    _residency.load_pipeline = slow if seconds else load


def until_asked_to_stop(limit: float) -> bool:
    """Look for the worker's stop as a call's steps do, until it comes (True) or ``limit``
    seconds pass (False)."""
    import time

    from genhook.engines.local import _host

    ends = time.monotonic() + limit
    while not _host._asked_to_stop():
        if time.monotonic() > ends:
            return False
        time.sleep(0.01)
    return True


def busy(seconds: float) -> None:
    """A command that never looks for a stop (a load, say)."""
    import time

    time.sleep(seconds)


def asked_to_stop() -> bool:
    from genhook.engines.local import _host

    return _host._asked_to_stop()
