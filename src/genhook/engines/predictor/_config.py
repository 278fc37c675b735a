"""The entries of ``GENHOOK_MODELS`` / ``GENHOOK_MODELS_FILE`` and the classes they name.

Checked when the registry is built, in every process: the entry's fields, the class (a file
path or an importable ``module:Class``; for ``cog``, the project's ``cog.yaml``), and its
``predict`` signature. A bad one stops the start with the entry's index and id and what is
wrong, instead of failing tasks later. The class is imported (its module runs) but never
instantiated here: ``setup`` runs in the worker that serves the model.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genhook.config import Settings, entry_name, model_entries, validation_problems
from genhook.engines.base import ModelKind
from genhook.engines.local import check_device
from genhook.engines.predictor._signature import (
    Outcome,
    Param,
    SignatureError,
    read_outcome,
    read_params,
)

DEFAULT_DEADLINE_SECONDS = 300.0


class PredictorEntry(BaseModel):
    """One model served by a predictor class: ``predictor`` or ``cog``, exactly one."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    kind: ModelKind
    # ``/path/to/file.py:Class`` or ``package.module:Class``.
    predictor: str | None = None
    # A Cog project directory: its ``cog.yaml`` names the predictor (``predict:``).
    cog: Path | None = None
    # What ``self.device`` says: auto is the worker's ``--device``, else cuda when torch
    # sees one, else cpu.
    device: str = "auto"
    # Calls one worker process runs at once (threads; the class must allow it).
    concurrency: int = Field(default=1, ge=1, le=64)
    # Dynamic batching (``predict_batch``): items per call, and the wait for more.
    max_batch_size: int = Field(default=1, ge=1, le=256)
    max_wait_ms: int = Field(default=0, ge=0, le=60_000)
    # Unset: the class's ``price_usd`` / ``deadline_seconds``, else 0 USD and 300 s.
    price_usd: Decimal | None = Field(default=None, ge=0)
    deadline_seconds: float | None = Field(default=None, gt=0)
    description: str = ""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        check_device(value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> PredictorEntry:
        if (self.predictor is None) == (self.cog is None):
            raise ValueError(
                'give exactly one of "predictor" (path.py:Class) or "cog" (a directory)'
            )
        if self.predictor is not None and ":" not in self.predictor:
            raise ValueError('"predictor" must have the form /path/file.py:Class or module:Class')
        return self


@dataclass(frozen=True, slots=True)
class PredictorModel:
    """A checked entry with its class and what its ``predict`` takes and returns."""

    entry: PredictorEntry
    cls: type[Any]
    params: list[Param]
    outcome: Outcome
    batched: bool  # the class has ``predict_batch``
    is_cog: bool
    # The method a call runs: ``predict`` (Cog's ``BaseRunner`` names it ``run``).
    method: str
    price_usd: Decimal
    deadline_seconds: float
    description: str

    @property
    def id(self) -> str:
        return self.entry.id


def load_predictor_models(settings: Settings) -> list[PredictorModel]:
    """Every configured predictor model; ``ValueError`` naming the bad entry otherwise."""
    entries = model_entries(settings.models, settings.models_file, "GENHOOK_MODELS_FILE")
    models = []
    for index, raw in enumerate(entries):
        name = entry_name("GENHOOK_MODELS", index, raw)
        try:
            entry = PredictorEntry.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"{name} is invalid: {validation_problems(exc)}") from None
        try:
            models.append(check_entry(entry))
        except (ValueError, ImportError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    return models


def check_entry(entry: PredictorEntry) -> PredictorModel:
    """Import the entry's class and read its ``predict``; ``ValueError`` saying what fails."""
    is_cog = entry.cog is not None
    cls = load_cog_class(entry.cog) if entry.cog is not None else load_class(entry.predictor or "")
    method = "predict"
    if not callable(getattr(cls, "predict", None)) or _abstract(cls, "predict"):
        if is_cog and callable(getattr(cls, "run", None)):
            method = "run"
        else:
            raise ValueError(f"{cls.__qualname__} has no predict method")
    function = getattr(cls, method)
    try:
        params = read_params(function)
        outcome = read_outcome(function, getattr(cls, "output_content_type", None))
    except SignatureError as exc:
        raise ValueError(f"{cls.__qualname__}: {exc}") from None
    batched = callable(getattr(cls, "predict_batch", None))
    if entry.max_batch_size > 1 and not batched:
        raise ValueError(
            f"max_batch_size is {entry.max_batch_size} but {cls.__qualname__} has no predict_batch"
        )
    price = entry.price_usd
    if price is None:
        price = Decimal(str(getattr(cls, "price_usd", None) or 0))
    if price < 0:
        raise ValueError(f"{cls.__qualname__}.price_usd is negative")
    deadline = entry.deadline_seconds or getattr(cls, "deadline_seconds", None)
    own = vars(cls).get("__doc__")  # not a base class's (Model's, BasePredictor's)
    doc = inspect.cleandoc(own) if isinstance(own, str) else ""
    description = entry.description or (doc.split("\n\n")[0].replace("\n", " ") if doc else "")
    return PredictorModel(
        entry=entry,
        cls=cls,
        params=params,
        outcome=outcome,
        batched=batched,
        is_cog=is_cog,
        method=method,
        price_usd=price,
        deadline_seconds=float(deadline or DEFAULT_DEADLINE_SECONDS),
        description=description or f"{cls.__qualname__}, a model served from its predict().",
    )


def _abstract(cls: type[Any], name: str) -> bool:
    """Whether ``cls`` leaves ``name`` as its base class's placeholder."""
    for base in cls.__mro__:
        if name in vars(base):
            return base.__module__ in ("genhook.model", "cog.predictor")
    return True


def load_class(target: str) -> type[Any]:
    """The class ``target`` names: ``/path/file.py:Class`` (the file's directory is put on
    ``sys.path`` first, so it imports its neighbours) or ``package.module:Class``."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(f"{target!r} must have the form /path/file.py:Class or module:Class")
    module = _import_file(Path(where)) if where.endswith(".py") else _import_module(where)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{where} defines no class {name!r}")
    return cls


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"module {name!r} cannot be imported: {exc}") from None


def _import_file(path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    # One module per file, under a name of its own: two entries of one file share it.
    name = f"genhook_predictor_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(f"{path} fails on import: {type(exc).__name__}: {exc}") from None
    return module


def load_cog_class(project: Path) -> type[Any]:
    """The predictor a Cog project's ``cog.yaml`` names (``predict: "predict.py:Predictor"``).
    Needs the ``cog`` package (``pip install 'genhook[cog]'``), which the project imports."""
    try:
        import yaml
    except ImportError:
        raise ValueError("Cog projects need PyYAML: pip install 'genhook[cog]'") from None
    if importlib.util.find_spec("cog") is None:
        raise ValueError("Cog projects need the cog package: pip install 'genhook[cog]'")
    project = project.expanduser().resolve()
    config_file = project / "cog.yaml"
    try:
        config = yaml.safe_load(config_file.read_text())
    except OSError as exc:
        raise ValueError(f"{config_file}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{config_file} is not valid YAML: {exc}") from None
    predict = config.get("predict") if isinstance(config, dict) else None
    if not isinstance(predict, str) or ":" not in predict:
        raise ValueError(f'{config_file} has no predict: "predict.py:Predictor" line')
    file, _, name = predict.rpartition(":")
    return load_class(f"{project / file}:{name}")
