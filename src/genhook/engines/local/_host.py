"""The model process: where a worker's pipelines are loaded and called.

A pipeline call on a GPU is bound by the Python thread that launches its kernels. In the
worker's own process that thread shares the interpreter with everything else the worker does
meanwhile: the next task's decoding and moderation, the last one's scaling, NSFW check and
encoding, the event loop's database work. On an H200 a call took 27% longer there than in a
plain loop, with the card busy 98% of the time (``docs/performance.md``). So each worker
process starts one child process that holds the process's ``Residency`` and does nothing but
load, unload and call pipelines, one command at a time; the worker keeps the pictures.

The worker sends a command (a function of this module and its arguments) on one pipe and
reads the replies: one per denoising step, then the result or the error. While a call runs,
the only thing it sends is ``STOP``, which the call reads between two steps and stops at. A
child that dies (a crash in a native library, the kernel's out-of-memory killer) fails the
command it was running and is started again, empty, for the next one. It ends with the
worker, however the worker ends (the worker's lifeline: ``runtime/lifeline.py``), and ignores
the terminal's Ctrl-C: the worker decides when a call stops.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

from genhook.config import Settings
from genhook.engines.local._config import LocalModel
from genhook.engines.local._residency import RESIDENCY, Adapter, free_memory
from genhook.runtime.lifeline import die_with_parent

log = logging.getLogger(__name__)

# What the worker sends while a call runs: stop it after its current step.
STOP = "stop"
# How often the worker looks at its jobs (cancel, deadline, shutdown) while a call runs.
_TICK_SECONDS = 0.05
# How long a call's first step may take before the call, asked to stop, counts as stuck (a
# card's warm-up, or a call heavier than any before: a batch, a larger size); later steps,
# twice the model's slowest.
FIRST_STEP_SECONDS = 60.0


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the model process freed its cache."""


class Stopped(Exception):
    """The call stopped after a step (or never began) because the worker asked it to."""


class ModelProcessExited(RuntimeError):
    """The model process died; it starts again, with no model loaded, on the next command."""


class CallClock:
    """When one model's calls last showed progress, and how long they go without: what says
    whether a call asked to stop is stuck. A call stops at the end of its denoising step, and a
    large model's step takes seconds; its load (of a model unloaded for another) may take
    minutes, and is never cut short: the model is what the next task needs."""

    def __init__(self) -> None:
        # The longest a call went without a sign of progress (from its start to its first
        # step, between two, from the last to its end).
        self.slowest = 0.0
        self._phase = "idle"  # or "loading" (a command loads its model first), "calling"
        self._since = 0.0
        self._stepped = False  # the running call has ended a step

    def stuck(self, asked_at: float) -> bool:
        """Whether the running call, asked to stop at ``asked_at`` (``time.monotonic()``),
        has gone longer without a step since than twice the slowest its model has made, and
        at least ``FIRST_STEP_SECONDS`` before its first step."""
        if self._phase != "calling":
            return False
        allowed = 2 * self.slowest
        if not self._stepped:
            allowed = max(allowed, FIRST_STEP_SECONDS)
        return time.monotonic() - max(asked_at, self._since) > allowed

    def loading(self) -> None:
        self._phase = "loading"

    def progressed(self, stepped: bool) -> None:
        """The call began (``stepped`` false) or ended a step or itself."""
        now = time.monotonic()
        if self._phase == "calling":
            self.slowest = max(self.slowest, now - self._since)
        # Before the phase: ``stuck`` reads them from another thread.
        self._since, self._stepped = now, stepped
        self._phase = "calling"

    def ended(self, replied: bool) -> None:
        if replied:
            self.progressed(True)
        self._phase = "idle"


class Host:
    """The worker's side of its model process: one command at a time (a pipeline, its
    scheduler above all, is not thread-safe), so a worker running two tasks of a model at once
    prepares one's inputs and encodes the other's pictures while the call runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._channel: Connection | None = None
        # The write end of the model process's lifeline (``die_with_parent``), held here only.
        self._lifeline: Connection | None = None
        # The models loaded there, and the LoRA adapters of each, as of the last reply: what
        # the worker's claim reads for affinity, without asking the process.
        self.loaded: frozenset[str] = frozenset()
        self.adapters: dict[str, frozenset[str]] = {}

    def run(
        self,
        function: Callable[..., Any],
        *args: Any,
        on_step: Callable[[int], None] | None = None,
        stop: Callable[[], bool] | None = None,
        clock: CallClock | None = None,
    ) -> Any:
        """``function(*args)`` in the model process; ``on_step`` sees each denoising step,
        the call stops after the step during which ``stop()`` turned true (or does not start,
        if it turned true while the call waited for another's to end), and ``clock`` times
        its progress."""
        with self._turn(stop):
            channel = self._started(args)
            asked = False  # to stop: ``STOP`` was sent
            clock = clock or CallClock()
            clock.loading()
            replied = False
            try:
                try:
                    channel.send((function, args))
                except OSError:  # it died since the check
                    raise self._exited() from None
                while True:
                    if not channel.poll(_TICK_SECONDS):
                        asked = asked or self._ask_to_stop(channel, stop)
                        continue
                    try:
                        kind, value, held = channel.recv()
                    except (EOFError, OSError):
                        raise self._exited() from None
                    if kind in ("call", "step"):
                        clock.progressed(kind == "step")
                        if kind == "step" and on_step is not None:
                            on_step(value)
                        asked = asked or self._ask_to_stop(channel, stop)
                        continue
                    replied = True
                    self.loaded, self.adapters = held
                    if kind == "error":
                        raise value
                    return value
            finally:
                clock.ended(replied)

    def _ask_to_stop(self, channel: Connection, stop: Callable[[], bool] | None) -> bool:
        """Send ``STOP`` if ``stop()`` says so; whether it was sent."""
        if stop is None or not stop():
            return False
        with contextlib.suppress(OSError):  # it died: the reply loop finds out
            channel.send(STOP)
        return True

    @contextlib.contextmanager
    def _turn(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """The model process to oneself; a call given up while it waits never starts."""
        while not self._lock.acquire(timeout=_TICK_SECONDS):
            if stop is not None and stop():
                raise Stopped
        try:
            yield
        finally:
            self._lock.release()

    def abort(self) -> None:
        """End the running call now, with the model process and its models (from another
        thread: the caller's ``run`` then raises ``ModelProcessExited``)."""
        process = self._process
        if process is not None and process.is_alive():
            log.warning("ending model process %s: its call did not stop", process.pid)
            process.kill()

    def pid(self) -> int | None:
        """The model process's id, while it runs."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def _started(self, args: tuple[Any, ...]) -> Connection:
        if self._process is not None and not self._process.is_alive():
            self._exited()  # while it waited (the kernel's out-of-memory killer): start anew
        if self._process is not None and self._channel is not None:
            return self._channel
        # The first command's settings (each command carries its own) format its log lines.
        settings = next((a for a in args if isinstance(a, Settings)), None) or Settings()
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        # Nothing is ever sent on it: the kernel closes this end when the worker dies.
        lifeline, watched = context.Pipe(duplex=False)
        process = context.Process(
            target=_serve,
            args=(theirs, settings, os.getpid(), lifeline),
            name=f"{multiprocessing.current_process().name}/models",
            daemon=True,
        )
        process.start()
        theirs.close()
        lifeline.close()
        log.info("model process %s started", process.pid)
        self._process, self._channel, self._lifeline = process, mine, watched
        return mine

    def _exited(self) -> ModelProcessExited:
        process = self._process
        assert process is not None and self._channel is not None
        self._channel.close()
        process.join(10)
        code = process.exitcode
        self._process = self._channel = None
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        self.loaded, self.adapters = frozenset(), {}
        log.error("model process %s %s; it starts again on the next task", process.pid, _how(code))
        return ModelProcessExited(f"the model process {_how(code)} during the call")


def _how(code: int | None) -> str:
    """How a model process ended, in words: a SIGKILL nobody here sent is most likely the
    kernel's out-of-memory killer."""
    if code is None or code >= 0:
        return f"exited with status {code}"
    name = signal.Signals(-code).name
    if -code == signal.SIGKILL:
        return f"was killed by signal {name} (probably the kernel's out-of-memory killer)"
    return f"was killed by signal {name}"


HOST = Host()
"""The model process of this worker process, started when a local model is first needed."""


# What follows runs in the model process.

_channel: Connection | None = None
_stopping = False  # the running command read ``STOP``


def _serve(channel: Connection, settings: Settings, parent: int, lifeline: Connection) -> None:
    """Run commands until the worker closes the channel (or dies: ``lifeline``'s write end
    is the worker's alone, and this process ends when it closes)."""
    global _channel, _stopping
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent, lifeline.fileno())
    from genhook.logs import configure_logging

    configure_logging(settings, "worker")
    _channel = channel
    while True:
        try:
            command = channel.recv()
        except (EOFError, OSError):
            return
        if command == STOP:  # sent as the last command ended: it asks nothing of the next
            continue
        _stopping = False
        _answer(channel, *command)
        del command  # its arguments (the pictures) are the call's, not the next one's


def _answer(channel: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Run one command and send its reply. Nothing of the call outlives this function: a
    failed call's tensors, which its error's frames hold, are freed before the next call."""
    try:
        reply: tuple[str, Any] = ("done", function(*args))
    except Exception as exc:
        reply = ("error", _portable(exc))
    held = (RESIDENCY.loaded(), RESIDENCY.adapters())
    try:
        channel.send((*reply, held))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        channel.send(("error", _portable(exc), held))


def _portable(exc: Exception) -> Exception:
    """``exc`` as the worker can receive it, with this process's traceback as a note, and
    without the frames (and the tensors they hold) of it and the errors it chains."""
    with contextlib.suppress(Exception):
        exc.add_note("in the model process:\n" + "".join(traceback.format_exception(exc)))
    chained: BaseException | None = exc
    while chained is not None:
        chained.__traceback__ = None
        chained = chained.__cause__ or chained.__context__
    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 (bytes made on the line itself)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _asked_to_stop() -> bool:
    """Whether the worker sent ``STOP`` during the running command: read from the channel
    without waiting (the worker sends nothing else while a command runs)."""
    global _stopping
    assert _channel is not None
    while not _stopping and _channel.poll():
        _stopping = _channel.recv() == STOP
    return _stopping


def after_step(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
    """The pipelines' ``callback_on_step_end``: report the step, stop if asked."""
    assert _channel is not None
    _channel.send(("step", step, None))
    if _asked_to_stop():
        raise Stopped
    return {}


def load(model: LocalModel, settings: Settings) -> str:
    """Load ``model`` (unloading the least recently used as needed); its device."""
    _pipeline(model, settings)
    return RESIDENCY.device(model.id)


def unload(model_id: str) -> None:
    RESIDENCY.unload(model_id)


def generate(
    model: LocalModel,
    settings: Settings,
    arguments: dict[str, Any],
    seeds: list[int],
    threads: int,
    dimensions: tuple[int, int],
    adapters: Sequence[Adapter] = (),
) -> tuple[Any, float]:
    """One pipeline call (generating ``dimensions``) with exactly ``adapters`` active: its
    pictures (or a video's frames) and its seconds."""
    import torch

    pipe = _pipeline(model, settings, adapters)
    assert _channel is not None
    if _asked_to_stop():  # given up while the model loaded
        raise Stopped
    _channel.send(("call", None, None))
    # The process's share of the cores (torch otherwise takes every core in each process).
    torch.set_num_threads(threads)
    started = time.monotonic()
    output = None
    # Out of memory is handled after the error is gone: its frames hold the call's tensors.
    try:
        output = pipe(
            **arguments,
            generator=[torch.Generator("cpu").manual_seed(seed) for seed in seeds],
            callback_on_step_end=after_step,
        )
    except RuntimeError as error:
        if not _exhausted(error):
            raise
    if output is None:
        free_memory(RESIDENCY.device(model.id))
        width, height = dimensions
        raise OutOfMemory(
            f"the device ran out of memory generating {width}*{height} with {model.id}; its "
            "memory was freed. Ask for a smaller size (or fewer frames), or give the model a "
            "device with fewer models beside it"
        )
    seconds = time.monotonic() - started
    return (output.frames if model.family.task == "video" else output.images), seconds


def _exhausted(error: RuntimeError) -> bool:
    """Out of memory, as torch says it on a card, or as the CPU's allocator does (a plain
    ``RuntimeError``)."""
    import torch

    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)


def _pipeline(model: LocalModel, settings: Settings, adapters: Sequence[Adapter] = ()) -> Any:

    # Out of memory is handled after the error is gone: its frames hold the half-loaded weights.
    try:
        return RESIDENCY.activate(model, settings, adapters)
    except RuntimeError as error:
        if not _exhausted(error):
            raise
    free_memory("cuda")
    raise OutOfMemory(
        f"local model {model.id!r} does not fit in the device's free memory beside what else "
        "runs there"
    )
