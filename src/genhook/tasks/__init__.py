"""The task domain: submission, the state machine, leases, deadlines and workers."""

from genhook.tasks.lifecycle import Lifecycle
from genhook.tasks.submission import Submitter
from genhook.tasks.views import prediction_view
from genhook.tasks.worker import Worker

__all__ = ["Lifecycle", "Submitter", "Worker", "prediction_view"]
