"""Bring your own model: one class with ``setup`` and a typed ``predict``.

The service derives the request schema (and so the catalogue entry, the console's form and
OpenAPI) from ``predict``'s signature, checks every request against it at submit, and hands
``predict`` decoded values: a ``PIL.Image.Image`` for a picture, a ``pathlib.Path`` for any
other file. Configure the class with ``GENHOOK_MODELS`` (see ``docs/engines/your-model.md``)::

    from PIL import Image, ImageOps
    from genhook.model import Input, Model

    class Posterize(Model):
        def setup(self) -> None:
            self.calls = 0

        def predict(
            self, image: Image.Image, level: int = Input(2, ge=1, le=8, description="bits")
        ) -> Image.Image:
            self.calls += 1
            return ImageOps.posterize(ImageOps.invert(image.convert("RGB")), level)

This module imports nothing but the standard library, so a model file can be read by the
API process (for its schema) without loading what ``setup`` loads.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

__all__ = ["Input", "InputSpec", "Model", "Output", "Stopped"]


@dataclass(frozen=True, slots=True)
class InputSpec:
    """What ``Input(...)`` returns: a parameter's default, bounds and description."""

    default: Any = ...
    description: str | None = None
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    lt: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    regex: str | None = None
    choices: tuple[Any, ...] | None = None


def Input(
    default: Any = ...,
    *,
    description: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    regex: str | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A ``predict`` parameter's default (none: the field is required), numeric bounds,
    length bounds (of a string, or the items of a list), a pattern, the allowed values, and
    the description shown in the catalogue and the console."""
    return InputSpec(
        default=default,
        description=description,
        ge=ge,
        le=le,
        gt=gt,
        lt=lt,
        min_length=min_length,
        max_length=max_length,
        regex=regex,
        choices=None if choices is None else tuple(choices),
    )


@dataclass(frozen=True, slots=True)
class Output:
    """Declares the content type of ``bytes`` a ``predict`` returns:
    ``-> Annotated[bytes, Output("audio/wav")]``."""

    content_type: str


class Stopped(Exception):
    """Raised by ``Model.progress`` once every task of the call was given up (canceled,
    past its deadline, the worker stopping): the call ends there and its outcome is not
    recorded. A model that catches it should let it through."""


# The reporter of the call running in this thread: set by the engine around each call.
Reporter = Callable[[float | None, str | None], bool]
_reporter: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "genhook_model_reporter", default=None
)


class Model:
    """Subclass it: ``setup(self)`` runs once per worker process before the first call,
    ``predict(self, **inputs)`` once per task (its annotations are the request schema).

    Optional: ``predict_batch(self, items)`` takes a list of input dicts and returns one
    output (or an ``Exception`` that fails that item alone) per item, for dynamic batching
    (``max_batch_size`` and ``max_wait_ms`` in the entry); ``price_usd`` and
    ``deadline_seconds`` as class attributes are the defaults of the entry's fields.
    """

    price_usd: ClassVar[Decimal | float | str | None] = None
    deadline_seconds: ClassVar[float | None] = None
    # The content type of ``bytes`` outputs, when the annotation does not declare it.
    output_content_type: ClassVar[str | None] = None
    # Where this worker runs device models: the entry's ``device`` (``cpu``, ``cuda:0``...).
    device: str = "cpu"

    def setup(self) -> None:
        """Load weights and anything else the calls share; once per worker process."""

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """One task's output from its inputs. Every model defines its own: an entry whose
        class does not is refused at start (``engines/predictor/_config.py``)."""
        raise TypeError(f"{type(self).__name__} defines no predict()")

    def progress(self, fraction: float | None = None, log: str | None = None) -> None:
        """Report how far the call is (0 to 1) and/or a short log line, shown while the task
        runs and in its event stream; raises ``Stopped`` once nobody waits for the outcome
        (the task canceled or timed out), so a long loop that reports each step stops there.
        Outside a served call (a test calling ``predict`` directly) it does nothing."""
        reporter = _reporter.get()
        if reporter is not None and reporter(fraction, log):
            raise Stopped("the task was given up")

    def cancelled(self) -> bool:
        """Whether every task of this call was given up, without reporting anything."""
        reporter = _reporter.get()
        return reporter is not None and reporter(None, None)
