"""Which local models, and LoRA adapters of them, a process holds loaded, per device, under
a memory budget.

One ``Residency`` per model process (``_host.py``): a worker serves several local models,
and those that share a device share its memory. A model that does not fit beside the others
unloads the least recently used first; one that cannot fit even alone is refused before
anything is loaded. Adapters are loaded into their model's pipeline once and weighed with
it; room is made by unloading the least recently used adapters before any model (an adapter
loads in a fraction of a second, a model in many), and a call activates its own adapters
(``set_adapters``) or none (the base weights alone, exactly).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genhook.config import Settings
from genhook.engines.local._config import LocalModel, check_directory, weight_bytes

log = logging.getLogger(__name__)

_GIB = 1 << 30
# Of a card's memory, what the budget leaves for activations when none is configured.
_DEFAULT_SHARE = 0.9


class ModelTooLarge(RuntimeError):
    """A model's weights alone exceed its device's budget."""


class DeviceUnavailable(RuntimeError):
    """A model's device is not there (a torch without CUDA, no such card)."""


class AdapterUnfit(ValueError):
    """A LoRA adapter's file does not load into its model's pipeline (another architecture)."""


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter a call uses: its name in the pipeline, its file and its scale."""

    name: str
    file: Path
    scale: float


@dataclass(slots=True)
class Resident:
    pipeline: Any
    device: str
    bytes: int
    # The LoRA adapters loaded into the pipeline and the bytes each takes, least recently
    # used first.
    adapters: OrderedDict[str, int] = field(default_factory=OrderedDict)
    # The adapters (and scales) the last call left active, None when unknown (a load or an
    # unload changes them): a call with the same set skips set_adapters.
    active: tuple[tuple[str, float], ...] | None = ()

    @property
    def total(self) -> int:
        return self.bytes + sum(self.adapters.values())


def resolve_device(model: LocalModel, settings: Settings) -> str:
    """The entry's device; ``auto`` takes the worker's, else cuda when present, else cpu.
    A card is always named by its number (``cuda`` is ``cuda:0`` when that is the current
    one), so two spellings of one card share its memory budget."""
    import torch

    device = model.device if model.device != "auto" else settings.local_models_device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        asked = f"local model {model.id!r} is set to run on {device}, but"
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                raise DeviceUnavailable(f"{asked} this machine's torch is built without CUDA")
            raise DeviceUnavailable(
                f"{asked} torch sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES)"
            )
        count = torch.cuda.device_count()
        number = int(device.partition(":")[2] or torch.cuda.current_device())
        if number >= count:
            raise DeviceUnavailable(f"{asked} this worker sees {count} CUDA device(s)")
        return f"cuda:{number}"
    return device


def budget_bytes(device: str, settings: Settings) -> int:
    """Bytes of weights a device may hold; 0 for no limit (the CPU, unless configured)."""
    if settings.local_models_memory_gb > 0:
        return int(settings.local_models_memory_gb * _GIB)
    if device.startswith("cuda"):
        import torch

        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return int(total * _DEFAULT_SHARE)
    return 0


class Residency:
    def __init__(self) -> None:
        self._loaded: OrderedDict[str, Resident] = OrderedDict()
        self._lock = threading.RLock()
        # Counted for the benchmark and the log: loads and unloads since start.
        self.loads = 0
        self.unloads = 0

    def loaded(self) -> frozenset[str]:
        return frozenset(self._loaded)

    def adapters(self) -> dict[str, frozenset[str]]:
        """The adapters loaded per model (the models that have any)."""
        return {m: frozenset(r.adapters) for m, r in self._loaded.items() if r.adapters}

    def device(self, model_id: str) -> str:
        """The device a loaded model is on."""
        return self._loaded[model_id].device

    def pipeline(self, model: LocalModel, settings: Settings) -> Any:
        """``model``'s pipeline, loaded (unloading the least recently used as needed)."""
        with self._lock:
            resident = self._loaded.get(model.id)
            if resident is not None:
                self._loaded.move_to_end(model.id)
                return resident.pipeline
            device = resolve_device(model, settings)
            dtype = effective_dtype(model.dtype, device)
            files = check_directory(model.path, model.pipeline, model.variant)
            need = weight_bytes(files, dtype)
            budget = budget_bytes(device, settings)
            if budget and need > budget:
                raise ModelTooLarge(
                    f"local model {model.id!r} needs {need / _GIB:.2f} GiB for its weights in "
                    f"{dtype}, more than the {budget / _GIB:.2f} GiB budget of {device} "
                    "(GENHOOK_LOCAL_MODELS_MEMORY_GB)"
                )
            self._make_room(device, need, budget, model.id, ())
            started = time.monotonic()
            log.info("loading local model %s (%s) on %s", model.id, model.pipeline, device)
            pipeline = load_pipeline(model, device, dtype)
            self._loaded[model.id] = Resident(pipeline, device, need)
            self.loads += 1
            log.info(
                "local model %s loaded on %s in %.1f s (%.2f GiB)",
                model.id,
                device,
                time.monotonic() - started,
                need / _GIB,
            )
            return pipeline

    def _used(self, device: str) -> int:
        return sum(r.total for r in self._loaded.values() if r.device == device)

    def _make_room(
        self, device: str, need: int, budget: int, model_id: str, keep: Sequence[str]
    ) -> None:
        """Unload what ``device`` holds until ``need`` more bytes fit its budget: the least
        recently used adapters first (of any model there but those ``keep`` names of
        ``model_id``), then the least recently used other models."""
        if not budget:
            return
        for other_id, other in list(self._loaded.items()):
            if other.device != device:
                continue
            for name in list(other.adapters):
                if self._used(device) + need <= budget:
                    return
                if other_id == model_id and name in keep:
                    continue
                log.info("unloading LoRA adapter %s of %s to make room", name, other_id)
                self._delete_adapter(other, name)
        for older in list(self._loaded):
            if self._used(device) + need <= budget:
                return
            if older != model_id and self._loaded[older].device == device:
                log.info("unloading local model %s to make room for %s", older, model_id)
                self.unload(older)

    def activate(self, model: LocalModel, settings: Settings, adapters: Sequence[Adapter]) -> Any:
        """``model``'s pipeline with exactly ``adapters`` active at their scales (loading
        those it lacks), or none: the base weights alone, as if no adapter was ever loaded."""
        with self._lock:
            pipeline = self.pipeline(model, settings)
            resident = self._loaded[model.id]
            wanted = [adapter.name for adapter in adapters]
            for adapter in adapters:
                if adapter.name in resident.adapters:
                    resident.adapters.move_to_end(adapter.name)
                    continue
                self._load_adapter(model, settings, resident, adapter, wanted)
            active = tuple((a.name, a.scale) for a in adapters if a.scale != 0)
            if active != resident.active:
                if active:
                    pipeline.enable_lora()
                    pipeline.set_adapters([n for n, _ in active], [s for _, s in active])
                elif resident.adapters:
                    pipeline.disable_lora()
                resident.active = active if resident.adapters else ()
            return pipeline

    def _load_adapter(
        self,
        model: LocalModel,
        settings: Settings,
        resident: Resident,
        adapter: Adapter,
        wanted: Sequence[str],
    ) -> None:
        from safetensors.torch import load_file

        # Weighed as float32: PEFT keeps an adapter of a half-precision model in float32.
        need = weight_bytes([adapter.file], "float32")
        budget = budget_bytes(resident.device, settings)
        while len(resident.adapters) >= model.max_loaded_loras:
            oldest = next(n for n in resident.adapters if n not in wanted)
            log.info("unloading LoRA adapter %s of %s (%d loaded)", oldest, model.id, len(wanted))
            self._delete_adapter(resident, oldest)
        self._make_room(resident.device, need, budget, model.id, wanted)
        if budget and self._used(resident.device) + need > budget:
            raise ModelTooLarge(
                f"LoRA adapter {adapter.file.name} does not fit beside local model "
                f"{model.id!r} and its other adapters in the {budget / _GIB:.2f} GiB budget "
                f"of {resident.device} (GENHOOK_LOCAL_MODELS_MEMORY_GB)"
            )
        started = time.monotonic()
        try:
            with warnings.catch_warnings():  # PEFT's note that the model has other adapters
                warnings.filterwarnings("ignore", "Already found a `peft_config`", UserWarning)
                resident.pipeline.load_lora_weights(
                    load_file(adapter.file), adapter_name=adapter.name
                )
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            with contextlib.suppress(Exception):  # what the failed load left, if anything
                resident.pipeline.delete_adapters([adapter.name])
            resident.active = None
            raise AdapterUnfit(
                f"LoRA adapter {adapter.file} does not load into local model {model.id!r} "
                f"({model.pipeline}): {type(exc).__name__}: {exc}"
            ) from None
        resident.adapters[adapter.name] = need
        resident.active = None  # loading activates the new adapter alone
        log.info(
            "LoRA adapter %s of %s loaded in %.2f s (%.1f MiB)",
            adapter.name,
            model.id,
            time.monotonic() - started,
            need / (1 << 20),
        )

    def _delete_adapter(self, resident: Resident, name: str) -> None:
        resident.pipeline.delete_adapters([name])
        del resident.adapters[name]
        resident.active = None  # PEFT activates another in place of a deleted active one
        free_memory(resident.device)

    def unload(self, model_id: str) -> None:
        with self._lock:
            resident = self._loaded.pop(model_id, None)
            if resident is None:
                return
            device = resident.device
            del resident
            self.unloads += 1
            free_memory(device)


def effective_dtype(dtype: str, device: str) -> str:
    """float16 kernels are missing or slow on the CPU: there it runs in float32."""
    return "float32" if device == "cpu" and dtype == "float16" else dtype


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def load_pipeline(model: LocalModel, device: str, dtype: str) -> Any:
    """Local files only, safetensors only: no pickle is ever unpickled, nothing is fetched."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    _quiet_fallback_notice()
    import diffusers
    import torch
    import transformers

    # The log's own lines say what loads and how long it took; no progress bars in it.
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    pipeline_class = getattr(diffusers, model.pipeline)
    components: dict[str, Any] = {}
    if model.pipeline == "QwenImageEditPipeline":
        # Without the video processor, which would need torchvision (_qwen.py).
        from genhook.engines.local._qwen import load_processor

        components["processor"] = load_processor(model.path / "processor")
    with warnings.catch_warnings():
        # Newer diffusers name it ``dtype``; the older ones this supports know only this name.
        warnings.filterwarnings("ignore", "`torch_dtype` is deprecated", FutureWarning)
        pipeline = pipeline_class.from_pretrained(
            model.path,
            torch_dtype=getattr(torch, dtype),
            local_files_only=True,
            use_safetensors=True,
            variant=model.variant,
            **components,
        )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


class _TorchvisionFallback(logging.Filter):
    """Drops transformers' notice that an image processor "requires torchvision (not
    installed); falling back to" its Pillow twin: without torchvision that twin is the one
    meant, and the notice would be in the service log on every start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "requires torchvision (not installed); falling back to" not in record.getMessage()


def _quiet_fallback_notice() -> None:
    """Install ``_TorchvisionFallback`` on the logger that says it, before diffusers'
    pipelines import their processors (which is when it is said)."""
    logger = logging.getLogger("transformers.utils.import_utils")
    if not any(isinstance(f, _TorchvisionFallback) for f in logger.filters):
        logger.addFilter(_TorchvisionFallback())


RESIDENCY = Residency()
