"""Model residency and affinity: which worker takes a task of a model with affinity.

A model with ``ModelSpec.affinity`` (a local model) costs a load, and often an unload of
another model, on a worker that lacks its weights; the registry says which models this
process holds (``Registry.resident``). Each worker applies three rules at its claim:

1. **Its own first.** A model it holds has its tasks taken before any other model's, however
   old those are (until the bound below): a worker never unloads a model while tasks for it
   wait, just because another model's task is older. Among a held model's tasks, those that
   name more of the adapters it holds (LoRAs: ``Registry.resident_adapters``) go first, then
   the oldest: of two workers holding one model with different adapters, each takes the tasks
   of its own adapters, and loads another's only when none of its own wait.
2. **A switch waits for the cheaper worker.** A task of a model it lacks is taken only once
   the task has waited the *hold*: ``GENHOOK_LOCAL_MODELS_AFFINITY_SECONDS``, or twice the
   model's recent call time when that is longer (a worker that holds the model is busy for
   a call before it can take the next task). A worker that holds another model with
   affinity waits twice the hold, as its switch also unloads: so a task of a model no worker
   holds goes to a worker with nothing to unload when there is one.
3. **Bounded.** A task that has waited ``OVERDUE_HOLDS`` holds is taken oldest first by any
   worker, whatever it holds (model or adapters): no task waits longer than that bound plus
   the calls queued before it.

A wait of 0 turns affinity off: no hold and no preference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

# A task that has waited this many holds loses its affinity: any worker takes it, oldest
# first (rule 3).
OVERDUE_HOLDS = 10


class Affinity:
    """The claim's affinity terms for one worker process."""

    def __init__(
        self,
        seconds: Callable[[], float],
        models: Iterable[str],
        resident: Callable[[], frozenset[str]],
        call_seconds: Mapping[str, Iterable[float]],
        adapters: Callable[[], Mapping[str, frozenset[str]]] = dict,
    ) -> None:
        self._seconds = seconds  # read each time: tests and operators may change it live
        self.models = list(models)
        self.resident = resident
        self._calls = call_seconds
        self._adapters = adapters

    def _base_ms(self) -> int:
        return int(self._seconds() * 1000) if self.models else 0

    def _call_ms(self, model: str) -> int:
        """The longest recent call of ``model`` here, or of any model with affinity here
        when this process has not run it (the same device, the same scale)."""
        own = list(self._calls.get(model, ()))
        if not own:
            own = [seconds for other in self.models for seconds in self._calls.get(other, ())]
        return int(1000 * max(own, default=0.0))

    def hold_ms(self) -> dict[str, int] | None:
        """Per model with affinity whose weights this process lacks, how long its task must
        have waited before this worker takes it (rule 2); None when none, or affinity is off."""
        base = self._base_ms()
        if not base:
            return None
        resident = self.resident()
        switch = 2 if any(model in resident for model in self.models) else 1
        holds = {
            model: switch * max(base, 2 * self._call_ms(model))
            for model in self.models
            if model not in resident
        }
        return holds or None

    def preferred(self) -> tuple[str, ...]:
        """The models with affinity this process holds: their tasks are claimed first."""
        if not self._base_ms():
            return ()
        resident = self.resident()
        return tuple(model for model in self.models if model in resident)

    def held_adapters(self, preferred: Iterable[str]) -> tuple[tuple[str, str], ...]:
        """The ``(model, adapter)`` pairs this process holds of the ``preferred`` models: a
        task naming them goes first among its model's (rule 1)."""
        held = self._adapters()
        return tuple((model, name) for model in preferred for name in sorted(held.get(model, ())))

    def overdue_ms(self) -> int:
        """How long a task waits before its affinity ends (rule 3)."""
        longest = max((self._call_ms(model) for model in self.models), default=0)
        return OVERDUE_HOLDS * 2 * max(self._base_ms(), 2 * longest)

    def idle_poll(self, poll: float) -> float:
        """How long an idle worker waits before it looks again: the poll, or the shortest
        hold while a task held for another worker may become this one's."""
        holds = self.hold_ms()
        if holds:
            return min(poll, max(0.05, min(holds.values()) / 1000))
        return poll
