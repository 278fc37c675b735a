"""The settings of one local-weight model, read from ``GENHOOK_LOCAL_MODELS`` or a JSON file.

Checked when the registry is built, like the upstream models: a bad entry, or a directory
that is not the pipeline it claims to be (or whose weight files' headers do not read), stops
the start with the entry's position and id and the field or file named, instead of failing
tasks later. Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genhook.config import Settings, entry_name, model_entries, validation_problems
from genhook.engines.base import ModelKind
from genhook.engines.edit_request import ALLOWED_SIZES, parse_size


@dataclass(frozen=True, slots=True)
class Family:
    """What a pipeline class does: ``edit`` (images in), ``text`` (prompt only) or ``video``
    (image to video), and the multiple its width and height must be."""

    task: Literal["edit", "text", "video"]
    multiple: int


FAMILIES: dict[str, Family] = {
    "StableDiffusionInstructPix2PixPipeline": Family("edit", 8),
    "FluxKontextPipeline": Family("edit", 16),
    "QwenImageEditPipeline": Family("edit", 16),
    "StableDiffusionXLPipeline": Family("text", 8),
    "FluxPipeline": Family("text", 16),
    "LTXImageToVideoPipeline": Family("video", 32),
}
DTYPES = ("float32", "float16", "bfloat16")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Files that hold weights in a pickle: never loaded, so a directory with only these is refused.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# LTX-Video makes 8k+1 frames.
_FRAME_STEP = 8
# LoRA adapters (docs/engines/local-models.md#lora-adapters): at most this many per request,
# each scale within plus or minus this bound; diffusers' standard file in an adapter's folder.
MAX_LORAS = 4
MAX_LORA_SCALE = 2.0
LORA_FILE = "pytorch_lora_weights.safetensors"
LORA_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class LoraEntry(BaseModel):
    """One LoRA adapter an entry offers: a ``.safetensors`` file, or a folder holding
    diffusers' standard ``pytorch_lora_weights.safetensors``."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    # The scale a request that names the adapter without one gets.
    scale: float = Field(default=1.0, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)
    description: str = ""
    # Added to the task's price for each task that uses the adapter (a usage line of its own).
    price_usd: Decimal = Field(default=Decimal("0"), ge=0)


class LocalModel(BaseModel):
    """One genhook model served from a diffusers pipeline directory on this machine."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    kind: ModelKind
    pipeline: str
    path: Path
    # auto: the worker's device (``--device``, GENHOOK_LOCAL_MODELS_DEVICE), else cuda when
    # present, else cpu.
    device: str = "auto"
    dtype: Literal["float32", "float16", "bfloat16"] = "float16"
    # The weights' variant, as their files name it (``fp16``: diffusion_pytorch_model.fp16.
    # safetensors); unset, the plain files.
    variant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_]+$")
    steps: int = Field(default=28, ge=1, le=500)
    max_steps: int = Field(default=100, ge=1, le=500)
    guidance_scale: float = Field(default=3.5, ge=0, le=50)
    # InstructPix2Pix's image guidance (how closely the output keeps the input).
    image_guidance_scale: float = Field(default=1.5, ge=0, le=50)
    # The sizes the model offers (a subset of the edit contract's); all of them when unset.
    sizes: list[str] = Field(default_factory=lambda: list(ALLOWED_SIZES), min_length=1)
    # The size the pipeline generates at, ``W*H``; unset, the requested size rounded down to
    # the family's multiple. The picture is then resized to exactly the requested size.
    generate_size: str | None = None
    # Video: frames generated per task (8k+1 for LTX-Video), spread over the requested
    # duration and frame rate.
    frames: int = Field(default=121, ge=1, le=1025)
    price_usd: Decimal = Field(default=Decimal("0"), ge=0)
    deadline_seconds: float = Field(default=600.0, gt=0)
    description: str = ""
    # Dynamic batching (docs/engines.md#batching): tasks of one call shape that one pipeline
    # call takes at most, and how long a worker holding fewer waits for more.
    max_batch_size: int = Field(default=1, ge=1, le=64)
    max_wait_ms: int = Field(default=0, ge=0, le=60_000)
    # LoRA adapters a request may name, by name; how many the model process keeps loaded
    # beside the pipeline (least recently used unloaded first); the price of an adapter a
    # request gives by URL (when GENHOOK_LOCAL_MODELS_LORA_URLS allows that).
    loras: dict[str, LoraEntry] = Field(default_factory=dict)
    max_loaded_loras: int = Field(default=16, ge=1, le=256)
    lora_url_price_usd: Decimal = Field(default=Decimal("0"), ge=0)

    @field_validator("pipeline")
    @classmethod
    def _pipeline(cls, value: str) -> str:
        if value not in FAMILIES:
            raise ValueError(f"pipeline must be one of: {', '.join(FAMILIES)}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        check_device(value)
        return value

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, value: list[str]) -> list[str]:
        for size in value:
            if size not in ALLOWED_SIZES:
                raise ValueError(f"size {size!r} is not one of: {', '.join(ALLOWED_SIZES)}")
        return value

    @field_validator("loras")
    @classmethod
    def _lora_names(cls, value: dict[str, LoraEntry]) -> dict[str, LoraEntry]:
        for name in value:
            if not re.match(LORA_NAME, name):
                raise ValueError(
                    f"LoRA name {name!r} must be 1-64 letters, digits, '_' or '-' "
                    "(starting with a letter or digit)"
                )
        return value

    @field_validator("generate_size")
    @classmethod
    def _generate_size(cls, value: str | None) -> str | None:
        if value is not None:
            width, _, height = value.partition("*")
            if not (width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
                raise ValueError("generate_size must have the form WIDTH*HEIGHT")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LocalModel:
        family = self.family
        wanted = ModelKind.VIDEO if family.task == "video" else ModelKind.IMAGE
        if self.kind is not wanted:
            raise ValueError(f"kind must be {wanted.value!r} for {self.pipeline}")
        if self.steps > self.max_steps:
            raise ValueError("steps must not exceed max_steps")
        if self.generate_size is not None:
            width, height = self.generate_dimensions((1, 1))
            if width % family.multiple or height % family.multiple:
                raise ValueError(
                    f"generate_size must be a multiple of {family.multiple} for {self.pipeline}"
                )
        if self.pipeline.startswith("LTX") and (self.frames - 1) % _FRAME_STEP:
            raise ValueError(f"frames must be 8k+1 for {self.pipeline} (e.g. 97, 121)")
        return self

    @property
    def family(self) -> Family:
        return FAMILIES[self.pipeline]

    def generate_dimensions(self, requested: tuple[int, int]) -> tuple[int, int]:
        """Width and height the pipeline makes for a ``requested`` output size."""
        if self.generate_size is not None:
            width, _, height = self.generate_size.partition("*")
            return int(width), int(height)
        multiple = self.family.multiple
        return (
            max(multiple, requested[0] // multiple * multiple),
            max(multiple, requested[1] // multiple * multiple),
        )

    @property
    def max_pixels(self) -> int:
        return max(w * h for w, h in map(parse_size, self.sizes))


def check_device(value: str) -> None:
    if value in ("auto", "cpu", "cuda"):
        return
    head, _, number = value.partition(":")
    if head != "cuda" or not number.isdigit():
        raise ValueError("device must be auto, cpu, cuda or cuda:N")


def load_local_models(settings: Settings) -> list[LocalModel]:
    """Every configured local model; raises ``ValueError`` naming the bad entry and field, or
    the file of its directory that is missing or wrong."""
    entries = model_entries(
        settings.local_models, settings.local_models_file, "GENHOOK_LOCAL_MODELS_FILE"
    )
    models = []
    for index, entry in enumerate(entries):
        name = entry_name("local model", index, entry)
        try:
            model = LocalModel.model_validate(entry)
        except ValidationError as exc:
            raise ValueError(f"{name} is invalid: {validation_problems(exc)}") from None
        try:
            check_directory(model.path, model.pipeline, model.variant)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        for adapter, lora in model.loras.items():
            try:
                lora_file(lora.path)
            except ValueError as exc:
                raise ValueError(f"{name}, LoRA {adapter!r}: {exc}") from None
        models.append(model)
    return models


def check_directory(path: Path, pipeline: str, variant: str | None = None) -> list[Path]:
    """The safetensors files the loader reads from a ``save_pretrained`` directory of
    ``pipeline``: those of ``variant`` (a hub download often holds the plain files and an
    ``fp16`` variant side by side; only one of them is loaded, and weighed).

    Refused, naming the file: no ``model_index.json``, one naming another pipeline class, a
    component without its folder or config, weights only in pickle form, or only in another
    variant, or a weights file whose header does not read (``read_header``).
    """
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise ValueError(f"{index_file} does not exist")
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{index_file} is not readable JSON ({exc})") from None
    named = index.get("_class_name") if isinstance(index, dict) else None
    if named != pipeline:
        raise ValueError(f"{index_file} names the pipeline {named!r}, not {pipeline!r}")
    weights: list[Path] = []
    for component, value in index.items():
        if component.startswith("_") or not isinstance(value, list) or None in value:
            continue
        folder = path / component
        if not folder.is_dir():
            raise ValueError(f"{folder} (component {component!r}) does not exist")
        if not (folder / "config.json").is_file():
            continue  # a tokenizer, scheduler or processor: configuration only
        every = sorted(folder.glob("*.safetensors"))
        found = [file for file in every if _variant(file.name) == variant]
        if not found:
            pickled = [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
            if every:
                has = sorted({_variant(file.name) or "plain" for file in every})
                wanted = f"{variant!r} variant" if variant else "plain"
                raise ValueError(
                    f"{folder} has no {wanted} .safetensors weights, only: {', '.join(has)}; "
                    'set the entry\'s "variant" to match (unset: the plain files)'
                )
            why = f" (only pickle weights: {', '.join(pickled)})" if pickled else ""
            raise ValueError(f"{folder} has no .safetensors weights{why}")
        for file in found:
            read_header(file)
        weights.extend(found)
    return weights


def lora_file(path: Path) -> Path:
    """The safetensors file of a LoRA adapter at ``path`` (the file itself, or diffusers'
    standard file in a folder), its header read; refused, naming the file, otherwise (a
    pickle is never loaded)."""
    if path.is_dir():
        file = path / LORA_FILE
        if not file.is_file():
            pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
            why = f" (only pickle weights: {', '.join(pickled)})" if pickled else ""
            raise ValueError(f"{file} does not exist{why}")
    elif path.suffix != ".safetensors":
        raise ValueError(f"{path} is not a .safetensors file nor a folder holding {LORA_FILE}")
    elif not path.is_file():
        raise ValueError(f"{path} does not exist")
    else:
        file = path
    read_header(file)
    return file


# A weights file's name: its base, then ``.variant``, then ``-00001-of-00003`` when sharded.
_WEIGHTS_NAME = re.compile(r"^[^.]+?(?:\.(?P<variant>[^.]+?))?(?:-\d+-of-\d+)?\.safetensors$")


def _variant(name: str) -> str | None:
    match = _WEIGHTS_NAME.match(name)
    return match.group("variant") if match else None


# The tensor types safetensors defines, and the bytes of one item.
_ITEM_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# safetensors' own bound on a header's length.
_MAX_HEADER_BYTES = 100_000_000


def read_header(file: Path) -> dict[str, dict[str, Any]]:
    """The tensors of a safetensors file (name: dtype, shape, data offsets), read from its
    header (an 8-byte length, then JSON) without loading a tensor. A ``ValueError`` names
    the file and what is wrong: a header that is cut short, not JSON, or describes tensors
    that do not fit the file, which the loader would otherwise meet only in a task."""
    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError(f"{file}: not a safetensors file ({size} bytes, no header)")
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, _MAX_HEADER_BYTES):
                raise ValueError(
                    f"{file}: its safetensors header claims {length} bytes; the file has "
                    f"{size - 8} after the length (cut short or not safetensors)"
                )
            raw = handle.read(length)
    except OSError as exc:
        raise ValueError(f"{file}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{file}: its safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: its safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    tensors: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(entry, data_bytes)
        if problem:
            raise ValueError(f"{file}: tensor {name!r} in its safetensors header {problem}")
        tensors[name] = entry
    return tensors


def _tensor_problem(entry: Any, data_bytes: int) -> str | None:
    """What is wrong with one tensor's header entry, or None."""
    if not isinstance(entry, dict):
        return "is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ITEM_BYTES:
        return f"has an unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"has an invalid shape {shape!r}"
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        return f"has data offsets {offsets!r} outside the file's {data_bytes} data bytes"
    count = 1
    for dim in shape:
        count *= dim
    if offsets[1] - offsets[0] != count * _ITEM_BYTES[dtype]:
        return f"has {offsets[1] - offsets[0]} data bytes for {count} {dtype} items"
    return None


def weight_bytes(files: list[Path], dtype: str) -> int:
    """Bytes the floating-point weights of ``files`` take in ``dtype``, read from the
    safetensors headers without loading a tensor."""
    total = 0
    for file in files:
        for entry in read_header(file).values():
            count = 1
            for dim in entry["shape"]:
                count *= dim
            floating = entry["dtype"] in ("F32", "F16", "BF16", "F64")
            total += count * (_DTYPE_BYTES[dtype] if floating else _ITEM_BYTES[entry["dtype"]])
    return total
