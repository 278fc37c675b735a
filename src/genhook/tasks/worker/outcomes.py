"""The outcome rules: how a task that did not complete ends, whatever path ran it.

One place decides, for a lone task and for each task of a batch alike:

- a ``TaskFailure`` fails the task with its code (``TIMEOUT`` ends it as ``timeout``);
- a model process that died in the call (``MODEL_PROCESS_DIED``) runs the task again once on
  a fresh process, counted as a lost lease, as a killed worker's task is; the second death
  fails it with that code and the engine's words (the signal; SIGKILL: probably the
  out-of-memory killer);
- a storage or database fault outside the engine requeues the task unharmed (the service's
  own fault), and one while storing the outputs also gives it its deadline back;
- anything else is the engine's surprise: logged with its traceback, the task fails with
  ``ENGINE_ERROR`` and a message that points at the log.

And how a task leaves its worker early is said in the log as what it was: a user's cancel
(INFO) or a lost lease (WARNING).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from genhook.db import Task
from genhook.errors import ErrorCode, TaskFailure
from genhook.faults import is_infrastructure_error
from genhook.logs import bind_task, unbind
from genhook.statuses import TaskStatus
from genhook.tasks.store import reads

if TYPE_CHECKING:
    from genhook.tasks.worker.loop import Worker

log = logging.getLogger(__name__)

ENGINE_FAILED = "the engine failed unexpectedly; the error is in the service log"


class OutputsNotStored(Exception):
    """Storage refused a task's outputs through every retry: the service's fault, not the
    task's; the task is requeued with the time it lost given back (``Worker.store_outputs``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def end_failed(worker: Worker, task: Task, error: BaseException, *, in_engine: bool) -> None:
    """End ``task`` as ``error`` says (see the module's rules); ``in_engine``: raised by the
    engine or its load, where a storage-looking error is the engine's own."""
    context = bind_task(task.id, task.account_id)
    try:
        await _end_failed(worker, task, error, in_engine)
    finally:
        unbind(context)


async def _end_failed(worker: Worker, task: Task, error: BaseException, in_engine: bool) -> None:
    lifecycle = worker.lifecycle
    if isinstance(error, TaskFailure):
        if error.code == ErrorCode.MODEL_PROCESS_DIED and await _run_again(worker, task, error):
            return
        log.info("task %s failed: %s", task.id, error)
        if error.code == ErrorCode.TIMEOUT:
            await worker.end_task(task, lifecycle.time_out)
        else:
            await worker.end_task(task, lifecycle.fail, error.code, error.message)
    elif isinstance(error, OutputsNotStored):
        await worker.requeue(task, error.error, give_time_back=True)
    elif not in_engine and isinstance(error, Exception) and is_infrastructure_error(error):
        await worker.requeue(task, error)
    else:
        log.error("task %s: engine error", task.id, exc_info=error)
        await worker.end_task(task, lifecycle.fail, ErrorCode.ENGINE_ERROR, ENGINE_FAILED)


async def _run_again(worker: Worker, task: Task, error: TaskFailure) -> bool:
    """Requeue a task whose model process died under it, once: a lost lease, counted."""
    if task.lease_losses or worker.settings.max_lease_losses <= 1:
        return False
    try:
        requeued = await worker.lifecycle.requeue_lost(task.id, worker.worker_id)
    except Exception as fault:
        if not is_infrastructure_error(fault):
            raise
        return False  # its lease, once it runs out, requeues it all the same
    if requeued:
        log.warning("task %s: %s; running it again on a fresh one", task.id, error.message)
    return requeued


async def say_given_up(worker: Worker, task: Task, where: str) -> None:
    """Log why ``task`` left this worker before its end: canceled by its owner (INFO), or its
    lease lost to another worker or the sweeper (WARNING). One read, on this rare path."""
    status = None
    with contextlib.suppress(Exception):
        async with worker.db.read() as session:
            current = await reads.task_in(session, task.id)
            status = None if current is None else current.status
    context = bind_task(task.id, task.account_id)
    try:
        if status == TaskStatus.CANCELED:
            log.info("task %s: canceled by its owner; %s", task.id, where)
        else:
            log.warning("task %s: lease lost; %s", task.id, where)
    finally:
        unbind(context)
