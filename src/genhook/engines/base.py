"""The engine port: one small Protocol every model backend implements.

An engine is loaded once per worker process and runs one job at a time, synchronously, in
a worker thread; it raises ``TaskFailure`` for every expected failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    from genhook.config import Settings


class ModelKind(StrEnum):
    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


@dataclass(frozen=True, slots=True)
class EngineJob:
    task_id: str
    model: str
    # Validated request fields, without ``images`` and ``webhook_url`` (never passed on).
    params: Mapping[str, Any]
    # Input images as raw bytes, in request order, already fetched and size-capped.
    images: list[bytes]
    # The task's deadline (epoch ms), so an engine can stop retrying before it passes.
    deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EngineOutput:
    data: bytes
    content_type: str
    nsfw: bool = False


@dataclass(frozen=True, slots=True)
class EngineResult:
    outputs: list[EngineOutput]
    # Shown to the user in the result under ``info`` (e.g. how the prompt was understood).
    info: dict[str, Any] = field(default_factory=dict)
    # What an upstream provider charged for the job, when it says; recorded on the usage line.
    cost_usd: Decimal | None = None


class Engine(Protocol):
    def load(self) -> None:
        """Load weights, detectors and other per-process state; called once per process."""

    def run(self, job: EngineJob) -> EngineResult:
        """Run one job; raise ``genhook.errors.TaskFailure`` for expected failures."""


@runtime_checkable
class AsyncEngine(Engine, Protocol):
    """An I/O-bound engine: its jobs run on the worker's event loop, many at once."""

    async def run_async(self, job: EngineJob) -> EngineResult:
        """Run one job without blocking the loop; cancelled at the task's deadline."""


@dataclass(frozen=True, slots=True)
class Charge:
    """What one completed task costs; lines are (description, USD amount)."""

    tier: str
    output_pixels: int
    input_images: int
    lines: tuple[tuple[str, Decimal], ...]

    @property
    def total(self) -> Decimal:
        return sum((amount for _, amount in self.lines), Decimal(0))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A registered model: its wire schema, kind, deadline, price and engine factory."""

    id: str
    kind: ModelKind
    request_schema: type[BaseModel]
    engine_factory: Callable[[Settings], Engine]
    pricing: Callable[[Settings, BaseModel], Charge]
    deadline_seconds: float = 300.0
    # Submit paths (by kind) that accept this model; always includes ``kind``.
    accepted_on: frozenset[ModelKind] = frozenset()
    description: str = ""
    # Jobs of this model one worker process runs at once; above 1 only for ``AsyncEngine``s.
    concurrency: int = 1

    def accepts(self, path_kind: ModelKind) -> bool:
        return path_kind == self.kind or path_kind in self.accepted_on
