"""Stand-ins for model servers, registered through ``GENHOOK_EXTRA_ENGINES``.

They fake the outside world (a model backend) while every service path around them runs
for real: validation, storage, leases, outputs, billing, webhooks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from genhook.config import Settings
from genhook.engines.base import Engine, EngineJob, EngineOutput, EngineResult, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest, parse_size
from genhook.engines.registry import Registry, edit_pricing
from genhook.errors import ErrorCode, TaskFailure


class FakeEditEngine:
    """Renders a solid image of the requested size whose colour is the mean of the inputs.

    Prompt words steer it: ``sleep=<seconds>`` waits (an engine that cannot stop early),
    ``wait=<seconds>`` waits but stops early when the task is given up, ``fail`` fails with
    INSTRUCTION_INVALID, ``crash`` raises an unexpected error, ``nsfw`` flags the output,
    ``steps=<n>`` splits the sleep into n steps and reports progress and a log line after each.
    """

    loads = 0

    def load(self) -> None:
        FakeEditEngine.loads += 1

    def run(self, job: EngineJob) -> EngineResult:
        return self.render(job)

    def render(self, job: EngineJob) -> EngineResult:
        prompt = str(job.params["prompt"])
        words = dict(word.split("=", 1) for word in prompt.split() if "=" in word)
        steps = int(words.get("steps", "1"))
        for step in range(1, steps + 1):
            time.sleep(float(words.get("sleep", "0")) / steps)
            if "steps" in words:
                job.report(progress=step / steps, log=f"step {step} of {steps}")
        if "wait" in words:
            # Stops early when the job is given up, as an engine that can should.
            job.stop.wait(float(words["wait"]))
            job.stop_if_asked()
        if "fail" in prompt.split():
            raise TaskFailure(ErrorCode.INSTRUCTION_INVALID, "the prompt asked to fail")
        if "crash" in prompt.split():
            raise RuntimeError("unexpected engine bug")
        width, height = parse_size(str(job.params["size"]))
        colours = []
        for data in job.images:
            with Image.open(io.BytesIO(data)) as img:
                colours.append(img.convert("RGB").resize((1, 1)).getpixel((0, 0)))
        mean = tuple(sum(c[i] for c in colours) // len(colours) for i in range(3))
        fmt = str(job.params["output_format"])
        buffer = io.BytesIO()
        Image.new("RGB", (width, height), mean).save(buffer, "JPEG" if fmt == "jpeg" else "PNG")
        info: dict[str, Any] = {"inputs": len(job.images), "pid": os.getpid()}
        return EngineResult(
            outputs=[
                EngineOutput(
                    data=buffer.getvalue(),
                    content_type=f"image/{fmt}",
                    nsfw="nsfw" in prompt.split(),
                )
            ],
            info=info,
        )


def _fake(settings: Settings) -> Engine:
    return FakeEditEngine()


FAKE_EDIT = ModelSpec(
    id="test/fake-edit",
    kind=ModelKind.IMAGE,
    request_schema=EditRequest,
    engine_factory=_fake,
    pricing=edit_pricing,
    deadline_seconds=float(os.environ.get("GENHOOK_TEST_DEADLINE", "60")),
    accepted_on=frozenset({ModelKind.VIDEO}),
)
FAKE_AUDIO = ModelSpec(
    id="test/fake-audio",
    kind=ModelKind.AUDIO,
    request_schema=EditRequest,
    engine_factory=_fake,
    pricing=edit_pricing,
)


def register(registry: Registry) -> None:
    registry.register(FAKE_EDIT)
    registry.register(FAKE_AUDIO)


# A model whose tasks go preferably to a worker that has it loaded, as a local model's do
# (a test says which models a worker counts as loaded through ``Worker.resident``).
AFFINE = dataclasses.replace(FAKE_EDIT, id="test/affine", affinity=True)
# What ``AFFINE``'s engine says this process holds loaded (``Registry.resident``).
affine_loaded: frozenset[str] = frozenset()


def register_affine(registry: Registry) -> None:
    registry.register(AFFINE)
    registry.add_residency(lambda: affine_loaded)


def register_affine_and_io(registry: Registry) -> None:
    """``AFFINE`` beside a model of several calls at once: the worker's concurrent loop."""
    register_affine(registry)
    registry.register(dataclasses.replace(FAKE_EDIT, id="test/io", concurrency=4))


class OneModelDevice:
    """A device with room for one model's weights, as a local model's memory budget of one
    model per worker: a call of another model unloads the one held (a switch, counted)."""

    def __init__(self) -> None:
        self.loaded: frozenset[str] = frozenset()
        self.switches = 0
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def call(self, model: str, seconds: float) -> None:
        with self._lock:
            if self.loaded and model not in self.loaded:
                self.switches += 1
            self.loaded = frozenset({model})
            self.calls.append(model)
        time.sleep(seconds)


class ResidentEngine(FakeEditEngine):
    """``FakeEditEngine`` whose model must be on its worker's ``OneModelDevice`` to run."""

    def __init__(self, model: str, device: OneModelDevice) -> None:
        self.model = model
        self.device = device

    def run(self, job: EngineJob) -> EngineResult:
        self.device.call(self.model, CALL_SECONDS)
        return self.render(job)


# One call of a ``ResidentEngine`` model: long enough for a backlog to form behind it.
CALL_SECONDS = 0.1
RESIDENT_MODELS = ("test/resident-a", "test/resident-b")
# Each registry built (one per worker under test) gets a device of its own, in order.
devices: list[OneModelDevice] = []


def register_resident_pair(registry: Registry) -> None:
    """Two models with affinity that share one ``OneModelDevice`` per worker."""
    device = OneModelDevice()
    devices.append(device)
    for model in RESIDENT_MODELS:
        registry.register(
            dataclasses.replace(
                FAKE_EDIT,
                id=model,
                affinity=True,
                engine_factory=lambda _, model=model: ResidentEngine(model, device),  # type: ignore[misc]
            )
        )
    registry.add_residency(lambda: device.loaded)


class AdapterChoice(BaseModel):
    """One adapter a request names, as a local model's ``loras`` entry."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    scale: float = 1.0


class AdapterEditRequest(EditRequest):
    """``EditRequest`` with the adapters of a local model's request (``loras``)."""

    loras: list[AdapterChoice] = Field(default_factory=list)


class OneAdapterDevice:
    """A worker's model process with room for one adapter beside its model: a call naming
    another adapter loads it in place of the one held (a load, counted)."""

    def __init__(self) -> None:
        self.adapters: frozenset[str] = frozenset()
        self.loads = 0
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def call(self, names: frozenset[str]) -> None:
        with self._lock:
            if names - self.adapters:
                self.loads += 1
            self.adapters = names or self.adapters
            self.calls.append(",".join(sorted(names)))


class AdapterEngine(FakeEditEngine):
    """``FakeEditEngine`` whose call needs the request's adapters on its ``OneAdapterDevice``."""

    def __init__(self, device: OneAdapterDevice) -> None:
        self.device = device

    def run(self, job: EngineJob) -> EngineResult:
        self.device.call(frozenset(choice["name"] for choice in job.params.get("loras", ())))
        return self.render(job)


ADAPTER_MODEL = "test/adapters"
# Each registry built (one per worker under test) gets an adapter device of its own, in order.
adapter_devices: list[OneAdapterDevice] = []


def register_adapter_model(registry: Registry) -> None:
    """A model with affinity, held loaded, whose engine reports its held adapters through the
    registry's residency hook, as the local models' does."""
    device = OneAdapterDevice()
    adapter_devices.append(device)
    registry.register(
        dataclasses.replace(
            FAKE_EDIT,
            id=ADAPTER_MODEL,
            affinity=True,
            request_schema=AdapterEditRequest,
            engine_factory=lambda _: AdapterEngine(device),
        )
    )
    registry.add_residency(
        lambda: frozenset({ADAPTER_MODEL}), adapters=lambda: {ADAPTER_MODEL: device.adapters}
    )


class CountingBatchEngine(FakeEditEngine):
    """``FakeEditEngine`` that takes batches: jobs of one output size share a call, and every
    engine call is recorded as the task ids it was given (``calls``, in this process).

    A ``fail`` prompt is a ``TaskFailure`` entry for its job alone; a ``crash`` prompt makes
    the whole batch call raise (and, run alone, fails its own task).
    """

    calls: ClassVar[list[tuple[str, ...]]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def batch_key(self, job: EngineJob) -> Hashable:
        return str(job.params["size"])

    def run(self, job: EngineJob) -> EngineResult:
        with self.lock:
            self.calls.append((job.task_id,))
        return self.render(job)

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        with self.lock:
            self.calls.append(tuple(job.task_id for job in jobs))
        if any("crash" in str(job.params["prompt"]).split() for job in jobs):
            raise RuntimeError("one input of the batch breaks the whole call")
        results: list[EngineResult | TaskFailure] = []
        for job in jobs:
            try:
                results.append(self.render(job))
            except TaskFailure as failure:
                results.append(failure)
        return results


class PairedEngine(FakeEditEngine):
    """Completes a job only while another runs at the same time (a barrier of two), so a
    model of concurrency 2 passes and one that runs its calls one by one fails."""

    barrier: ClassVar[threading.Barrier] = threading.Barrier(2, timeout=20)

    def run(self, job: EngineJob) -> EngineResult:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise TaskFailure(ErrorCode.ENGINE_ERROR, "ran alone") from None
        return self.render(job)


class MatmulEngine:
    """A CPU stand-in for a model's forward pass: a stack of dense layers whose weights are
    read once per call, whatever the batch, as a GPU pipeline's are. One job's input is a
    vector hashed from its prompt; its output a small PNG from the last layer."""

    LAYERS = int(os.environ.get("GENHOOK_TEST_MATMUL_LAYERS", "8"))
    WIDTH = int(os.environ.get("GENHOOK_TEST_MATMUL_WIDTH", "2048"))

    def load(self) -> None:
        rng = np.random.default_rng(0)
        scale = 1 / np.sqrt(self.WIDTH)
        self.weights = [
            (rng.standard_normal((self.WIDTH, self.WIDTH)) * scale).astype(np.float32)
            for _ in range(self.LAYERS)
        ]

    def batch_key(self, job: EngineJob) -> Hashable:
        return str(job.params["size"])

    def run(self, job: EngineJob) -> EngineResult:
        return self._forward([job])[0]

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        return list(self._forward(jobs))

    def _forward(self, jobs: Sequence[EngineJob]) -> list[EngineResult]:
        rows = []
        for job in jobs:
            seed = hashlib.sha256(str(job.params["prompt"]).encode()).digest()
            rows.append(np.random.default_rng(list(seed)).standard_normal(self.WIDTH))
        x = np.asarray(rows, dtype=np.float32)
        for weights in self.weights:
            x = np.tanh(x @ weights)
        results = []
        for row in x:
            pixels = ((row[:192].reshape(8, 8, 3) + 1) * 127.5).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buffer, "PNG")
            output = EngineOutput(data=buffer.getvalue(), content_type="image/png")
            results.append(EngineResult(outputs=[output]))
        return results


class SlowLoadEngine(CountingBatchEngine):
    """``CountingBatchEngine`` whose load (a model's weights read from disk) lasts until the
    test sets ``loaded``; ``loads`` counts the loads begun, ``most`` the most at once."""

    loaded: ClassVar[threading.Event] = threading.Event()
    loads: ClassVar[int] = 0
    most: ClassVar[int] = 0
    _running: ClassVar[int] = 0

    def load(self) -> None:
        cls = SlowLoadEngine
        with cls.lock:
            cls.loads += 1
            cls._running += 1
            cls.most = max(cls.most, cls._running)
        cls.loaded.wait(60)
        with cls.lock:
            cls._running -= 1

    @classmethod
    def reset(cls) -> None:
        cls.loaded.clear()
        cls.loads = cls.most = cls._running = 0


class CountedLoadEngine(CountingBatchEngine):
    """``CountingBatchEngine`` that counts its loads (``loads``)."""

    loads: ClassVar[int] = 0

    def load(self) -> None:
        with self.lock:
            CountedLoadEngine.loads += 1


BATCH_MODEL = "test/batch"
PAIRED_MODEL = "test/paired"
MATMUL_MODEL = "test/matmul"
SLOW_LOAD_MODEL = "test/slow-load"
COUNTED_LOAD_MODEL = "test/counted-load"


def register_batching(registry: Registry) -> None:
    """The engines of the batching tests and benchmark (their sizes and waits are set per
    test with ``GENHOOK_MODEL_BATCHING``)."""
    # (model id, engine, max batch size, concurrency)
    engines: list[tuple[str, Callable[[], Engine], int, int]] = [
        (BATCH_MODEL, CountingBatchEngine, 4, 1),
        (PAIRED_MODEL, PairedEngine, 1, 2),
        (MATMUL_MODEL, MatmulEngine, 1, 1),
        (SLOW_LOAD_MODEL, SlowLoadEngine, 4, 1),
        (COUNTED_LOAD_MODEL, CountedLoadEngine, 1, 1),
    ]
    for model_id, engine, size, concurrency in engines:
        registry.register(
            ModelSpec(
                id=model_id,
                kind=ModelKind.IMAGE,
                request_schema=EditRequest,
                engine_factory=lambda settings, engine=engine: engine(),  # type: ignore[misc]
                pricing=edit_pricing,
                max_batch_size=size,
                concurrency=concurrency,
            )
        )
