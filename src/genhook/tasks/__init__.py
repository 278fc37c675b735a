"""The task domain: submission, the state machine, leases, deadlines and workers.

``Worker`` loads on first use: the API and the dispatcher import this package for
``Lifecycle`` and ``Submitter`` and never run the worker loop."""

from typing import TYPE_CHECKING

from genhook.lazy import lazy_names as _lazy_names
from genhook.tasks.lifecycle import Lifecycle
from genhook.tasks.submission import Submitter
from genhook.tasks.views import prediction_view

if TYPE_CHECKING:
    from genhook.tasks.worker import Worker

__getattr__ = _lazy_names(__name__, {"Worker": "worker"})

__all__ = ["Lifecycle", "Submitter", "Worker", "prediction_view"]
