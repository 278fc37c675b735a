"""The engine port: one small Protocol every model backend implements.

An engine is loaded once per worker process and runs one job at a time, synchronously, in
a worker thread; it raises ``TaskFailure`` for every expected failure. An engine that does
better on many inputs at once (one forward pass for a batch) also implements
``BatchEngine.run_batch``; the worker then hands it up to its model's ``max_batch_size``
jobs in one call (``tasks/worker/batch.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from genhook.errors import ErrorCode, TaskFailure

if TYPE_CHECKING:
    from genhook.config import Settings


class ModelKind(StrEnum):
    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


R = TypeVar("R", bound=BaseModel)


def stored_request(schema: type[R], params: Mapping[str, Any]) -> R:
    """The request a task was submitted with, rebuilt from its stored ``params`` without
    validating again (submit did); fields a task predates take the schema's defaults."""
    return schema.model_construct(**params)


def _no_report(progress: float | None = None, log: str | None = None) -> None:
    """Where a job reports when nobody listens (an engine run outside the worker)."""


# What a task given up (canceled, timed out, released) before its engine finished ends with.
STOPPED_EARLY = "stopped early: the task was given up"


@dataclass(frozen=True, slots=True)
class EngineJob:
    task_id: str
    model: str
    # Validated request fields, without input files (``images``, ``audio``) and
    # ``webhook_url`` (never passed on).
    params: Mapping[str, Any]
    # Input files (images, or a speech-to-text model's audio) as raw bytes, in request
    # order, already fetched and size-capped.
    images: list[bytes]
    # ``report(progress=0.5, log="line")`` from the engine's thread: progress 0 to 1 and/or a
    # short log line, shown in the result and its event stream. Cheap; the worker throttles.
    report: Callable[..., None] = _no_report
    # The task's deadline (Unix seconds): long engines stop computing past it.
    deadline: float | None = None
    # Set when the worker gives the task up (canceled, deadline, lost lease, shutdown); an
    # engine that can stop early checks it between steps, so its thread is free sooner.
    stop: threading.Event = field(default_factory=threading.Event, compare=False)
    # The model's ``request_schema`` instance the task was submitted with (see ``request_as``).
    request: BaseModel | None = None

    def given_up(self) -> bool:
        """Asked to stop, or past its deadline: nobody waits for this job's outcome."""
        return self.stop.is_set() or (self.deadline is not None and time.time() >= self.deadline)

    def stop_if_asked(self) -> None:
        """Raise when the task was given up; its outcome is no longer recorded anyway."""
        if self.stop.is_set():
            raise TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY)

    def request_as(self, schema: type[R]) -> R:
        """The validated request, typed: the one the worker parsed, or (a job built by hand)
        one rebuilt from ``params``. Defaults come from the schema alone."""
        if isinstance(self.request, schema):
            return self.request
        return stored_request(schema, self.params)

    @property
    def deadline_ms(self) -> int | None:
        """The deadline in epoch milliseconds, as the task row stores it."""
        return None if self.deadline is None else int(self.deadline * 1000)


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
    # A speech-to-text model's structured transcript, shown as ``stt_result``.
    stt_result: dict[str, Any] | None = None
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


@runtime_checkable
class StepEngine(Engine, Protocol):
    """An engine whose call, once every job's ``stop`` is set, stops at its next check point
    (a denoising step), which may be seconds away for a large model."""

    def stuck(self, asked_at: float) -> bool:
        """Whether a call asked to stop at ``asked_at`` (``time.monotonic()``) has run on
        for longer than its check points are apart. The worker asks after its usual half
        second, and aborts the call once it is."""

    def abort(self) -> None:
        """End a stuck call at once (called from another thread than the call's), so that
        the call returns and the worker process stays in service."""


@runtime_checkable
class BatchEngine(Engine, Protocol):
    """An engine that runs many jobs in one call (one forward pass for the batch).

    ``run`` stays the path for a lone job, and for each job of a batch whose call raised,
    so one poison input cannot fail its neighbours.
    """

    def batch_key(self, job: EngineJob) -> Hashable:
        """Which jobs may share a call: jobs with different keys never do (e.g. the output
        size, the step count, the language)."""

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        """One entry per job, in order: its result, or the ``TaskFailure`` that fails it
        alone. Raising fails the call, not the jobs: each is then run alone with ``run``.
        A job whose ``stop`` is set may be left out of the work (its entry is discarded)."""


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
    # The catalogue's price list: ``{"summary": words, "unit": ..., "prices_usd": {...}}``.
    price_list: Callable[[Settings], dict[str, Any]] | None = None
    # Calls of this model one worker process runs at once: an ``AsyncEngine``'s jobs on the
    # loop, or a thread-safe synchronous engine's calls in threads (each a batch when batched).
    concurrency: int = 1
    # Jobs one call of a ``BatchEngine`` takes at most, and how long a worker holding fewer
    # waits for more to arrive before it runs what it has (``tasks/worker/batch.py``).
    max_batch_size: int = 1
    max_wait_ms: int = 0
    # The catalogue's named choices of request fields a schema cannot list, such as each
    # voice with its engine and language: ``{"voices": [{...}, ...]}``.
    choices: Callable[[], dict[str, Any]] | None = None
    # Workers that hold its weights loaded are preferred for its tasks (local models): one
    # without them claims a task only after it waited GENHOOK_LOCAL_MODELS_AFFINITY_SECONDS.
    affinity: bool = False

    def accepts(self, path_kind: ModelKind) -> bool:
        return path_kind == self.kind or path_kind in self.accepted_on
