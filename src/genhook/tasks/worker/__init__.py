"""The worker: claims tasks, keeps their leases, runs their engines, records their outcomes.

- ``loop.py``: ``Worker`` and its one loop: per model, its slots (``ModelSpec.concurrency``),
  each slot's claim a batch of 1 to ``max_batch_size`` tasks;
- ``batch.py``: the batch runner, every claim's run (a lone task is a batch of one), for
  every engine kind: prepare, call, each task's cancel, deadline and stop, record;
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
