"""The worker: claims tasks, keeps their leases, runs their engines, records their outcomes.

- ``loop.py``: ``Worker``, the claim loop and the run of one task (a batch of one);
- ``slots.py``: per model, its calls at once (``ModelSpec.concurrency``), each slot a claim;
- ``batch.py``: the batch runner (1 to ``max_batch_size`` tasks of a model in one call);
- ``outcomes.py``: how a task that did not complete ends (failed, requeued, run again);
- ``affinity.py``: model residency and which worker takes a task of a local model;
- ``leases.py``: heartbeats and cancel checks for every task the process holds.
"""

from genhook.tasks.worker.loop import (
    LoadNotWanted,
    PreloadFailed,
    Worker,
    default_worker_id,
)

__all__ = ["LoadNotWanted", "PreloadFailed", "Worker", "default_worker_id"]
