"""Statements of the worker's hot path, built once: a claimed batch's input images and
the completion transaction. They run on the driver connection (``genhook.db.driver``) in
the worker's transactions, and through a session elsewhere.

A claim reads its batch's input images in its own transaction, so starting a task costs no
transaction of its own. Completing a task is the service's most frequent write: it costs one
conditional UPDATE of its own (a Core statement, not an ORM object), while a group commit's
tasks share one DELETE of their input blobs and one multi-row INSERT of their usage lines. The
UPDATE returns the whole finished row, so a task with a webhook renders its callback (what
polling shows) from it, without reading the task again (``terminal.complete_in``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Executable,
    Integer,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.attributes import instance_dict
from sqlalchemy.orm.instrumentation import manager_of_class

from genhook.db import Blob, Task, UsageLine
from genhook.db.driver import Tx, bound_insert
from genhook.statuses import TaskStatus

_tasks = cast(Table, Task.__table__)
_blobs = cast(Table, Blob.__table__)

COMPLETE = (
    update(_tasks)
    .where(
        _tasks.c.id == bindparam("task_id"),
        _tasks.c.status == TaskStatus.PROCESSING,
        _tasks.c.lease_owner == bindparam("owner"),
    )
    .values(
        status=TaskStatus.COMPLETED,
        outputs=bindparam("outputs"),
        has_nsfw_contents=bindparam("nsfw"),
        info=bindparam("info"),
        lease_owner=None,
        lease_expires_at=None,
        finished_at=bindparam("now"),
        updated_at=bindparam("now"),
        outputs_expire_at=bindparam("expire_at"),
    )
    .returning(*_tasks.c)
)
# A transcript is written only when there is one, so a task without one keeps what submit
# stored.
COMPLETE_WITH_STT = COMPLETE.values(stt_result=bindparam("stt_result"))


def _keyed(count: int, column: Any = _blobs.c.key, name: str = "key") -> Any:
    """``blobs.key IN (:key_0, ...)`` for ``count`` keys, or ``= :key_0`` for one: one
    statement per number of keys, each rendered once (an expanding IN is rendered anew at
    every execution, and the driver path renders a statement only once)."""
    if count == 1:
        return column == bindparam(f"{name}_0")
    return column.in_([bindparam(f"{name}_{index}") for index in range(count)])


@functools.lru_cache(maxsize=64)
def delete_blobs(count: int) -> Executable:
    return delete(_blobs).where(_keyed(count))


@functools.lru_cache(maxsize=64)
def read_blobs(count: int) -> Executable:
    return select(_blobs.c.key, _blobs.c.data).where(_keyed(count))


def keys_params(keys: Sequence[str], name: str = "key") -> dict[str, str]:
    return {f"{name}_{index}": key for index, key in enumerate(keys)}


# A usage line's columns besides its generated id, as ``usage_row`` fills them.
INSERT_USAGE = bound_insert(
    cast(Table, UsageLine.__table__),
    (
        "account_id",
        "task_id",
        "model",
        "tier",
        "output_pixels",
        "input_images",
        "lines",
        "amount_micros",
        "upstream_cost_micros",
        "created_at",
    ),
)


def _runnable(models: tuple[str, ...]) -> list[Any]:
    """Conditions of a task a worker serving ``models`` may start at ``:now``; ``:start_by_<i>``
    is ``now`` plus the time model ``i`` needs, so a task with less left before its deadline
    (it would only time out mid-run) is left for the sweeper to expire; ``:ready_by_<i>`` is
    ``now`` less how long the worker leaves model ``i``'s tasks to workers that have its
    weights loaded (affinity)."""
    now = bindparam("now", type_=BigInteger)
    return [
        _tasks.c.status == TaskStatus.CREATED,
        _tasks.c.available_at <= now,
        or_(_tasks.c.start_deadline_at.is_(None), _tasks.c.start_deadline_at > now),
        or_(
            *(
                and_(
                    _tasks.c.model == model,
                    _tasks.c.deadline_at > bindparam(f"start_by_{index}"),
                    _tasks.c.available_at <= bindparam(f"ready_by_{index}"),
                )
                for index, model in enumerate(models)
            )
        ),
    ]


def _take(which: Any, **values: Any) -> Update:
    """The UPDATE that puts the ``which`` tasks still waiting under ``:owner``'s lease
    (and sets ``values`` besides).

    A Core statement returning every column: the ORM's bulk UPDATE path costs more than
    building the claimed ``Task`` from its row (``claimed``)."""
    return (
        update(_tasks)
        .where(which, _tasks.c.status == TaskStatus.CREATED)
        .values(
            status=TaskStatus.PROCESSING,
            lease_owner=bindparam("owner"),
            lease_expires_at=bindparam("lease_until"),
            attempts=_tasks.c.attempts + 1,
            started_at=bindparam("now"),
            updated_at=bindparam("now"),
            **values,
        )
        .returning(*_tasks.c)
    )


_new_task = manager_of_class(Task).new_instance
_task_mapper = inspect(Task)


def claimed(rows: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Tasks from rows returning every column (``_take``, ``COMPLETE``), as detached
    ``Task`` objects, without an ORM query.

    Filled the way the ORM's loader fills an instance, straight into its ``__dict__``:
    ``Task(**row)`` goes through instrumented ``__set__`` per column, about 60 us a task, more
    than a claim's own SQL. Never added to a session; attributes read and set as usual."""
    if not _task_mapper.configured:  # a fresh process that has made no ORM query yet
        configure_mappers()
    tasks = []
    for row in rows:
        task = _new_task()
        instance_dict(task).update(row)
        tasks.append(task)
    return tasks


@functools.lru_cache(maxsize=256)
def claim_one(
    models: tuple[str, ...], preferred: tuple[str, ...] = (), adapters: int = 0
) -> Update:
    """Take the oldest runnable task of ``models``; built once per set of models, since
    building the statement costs more than running it.

    ``preferred`` (affinity: the models whose weights the worker holds) go first, oldest
    first, unless a task became runnable before ``:overdue_before``: those go before all.
    Among a preferred model's tasks, those naming more of the ``adapters`` the worker holds
    (``:held_model_<i>`` and ``:held_name_<i>``, ``held_params``) go first."""
    order: list[Any] = [_tasks.c.available_at]
    if preferred:
        order = _preference(models, preferred, adapters, _tasks.c.available_at)
    candidate = (
        select(_tasks.c.id)
        .where(*_runnable(models))
        .order_by(*order)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return _take(_tasks.c.id == candidate)


def _preference(
    models: tuple[str, ...], preferred: tuple[str, ...], adapters: int, then: Any
) -> list[Any]:
    """The order of a claim by an affine worker: overdue tasks (runnable before
    ``:overdue_before``), then those of its ``preferred`` models, then the rest; by
    ``then`` within each. Among a preferred model's tasks, those naming more of the
    ``adapters`` it holds go first."""
    overdue = _tasks.c.available_at <= bindparam("overdue_before", type_=BigInteger)
    mine: ColumnElement[bool] = _tasks.c.model.in_(
        [bindparam(f"preferred_{i}") for i in range(len(preferred))]
    )
    if then is _tasks.c.fair_tag:
        # Fair order: a preferred task goes first only within ``:fair_slack`` of virtual time
        # after the fair head (the smallest tag this worker may take).
        head = (
            select(func.min(_tasks.c.fair_tag))
            .where(*_runnable(models))
            .correlate(None)
            .scalar_subquery()
        )
        slack = bindparam("fair_slack", type_=BigInteger)
        mine = and_(mine, _tasks.c.fair_tag <= head + slack)
    order: list[Any] = [case((overdue, 0), (mine, 1), else_=2)]
    if adapters:
        order.append(case((overdue, 0), else_=_adapters_held(adapters)).desc())
    return [*order, then]


def _fair_pick(
    models: tuple[str, ...], preferred: tuple[str, ...], adapters: int
) -> tuple[Any, Any]:
    """The fair claim's two picks, as CTEs: ``head``, the runnable task with the smallest
    tag (the account whose turn it is), and ``best``, that account's runnable task of the
    highest priority, oldest first (``ix_tasks_account_queue``); with affinity ``head``
    follows ``_preference`` and ``best`` stays with the head's model."""
    order = (
        _preference(models, preferred, adapters, _tasks.c.fair_tag)
        if preferred
        else [_tasks.c.fair_tag]
    )
    head = (
        select(_tasks.c.id, _tasks.c.account_id, _tasks.c.fair_tag, _tasks.c.model)
        .where(*_runnable(models))
        .order_by(*order)
        .limit(1)
        .with_for_update(skip_locked=True)
        .cte("head")
    )
    # The head's account (and model) as scalar subqueries, not a join with ``head``: a
    # join's inner side cannot hand its index order up past the join, so PostgreSQL would
    # read and sort all of the account's waiting tasks; a value walks
    # ``ix_tasks_account_queue`` in order and stops at the first.
    mine = [_tasks.c.account_id == select(head.c.account_id).scalar_subquery()]
    within: list[Any] = [_tasks.c.priority.desc()]
    if preferred:
        # The head's model, overdue tasks first, then those naming the adapters held.
        mine.append(_tasks.c.model == select(head.c.model).scalar_subquery())
        overdue = _tasks.c.available_at <= bindparam("overdue_before", type_=BigInteger)
        within.append(case((overdue, 0), else_=1))
        if adapters:
            within.append(_adapters_held(adapters).desc())
    best = (
        select(_tasks.c.id, _tasks.c.fair_tag)
        .where(*_runnable(models), *mine)
        .order_by(*within, _tasks.c.created_at)
        .limit(1)
        .with_for_update(skip_locked=True, of=_tasks)
        .cte("best")
    )
    return head, best


@functools.lru_cache(maxsize=256)
def claim_fair(
    models: tuple[str, ...], preferred: tuple[str, ...] = (), adapters: int = 0
) -> Update:
    """The fair claim in one statement (PostgreSQL): take ``best`` with ``head``'s tag,
    and give ``head`` the tag ``best`` had, so that an account taking a higher-priority
    task out of turn is charged the turn it used (docs/scheduling.md)."""
    head, best = _fair_pick(models, preferred, adapters)
    swap = (
        update(_tasks)
        .where(_tasks.c.id == head.c.id, head.c.id != best.c.id)
        .values(fair_tag=best.c.fair_tag)
        .returning(_tasks.c.id)
        .cte("swap")
    )
    return _take(_tasks.c.id == best.c.id, fair_tag=head.c.fair_tag).add_cte(swap)


@functools.lru_cache(maxsize=256)
def fair_pick(models: tuple[str, ...], preferred: tuple[str, ...] = (), adapters: int = 0) -> Any:
    """``claim_fair``'s picks as a read (SQLite, where a CTE cannot write): the head's and
    the best task's ids and tags; ``TAKE_FAIR`` and ``SWAP_TAG`` then write."""
    head, best = _fair_pick(models, preferred, adapters)
    return select(
        head.c.id.label("head_id"),
        head.c.fair_tag.label("head_tag"),
        best.c.id.label("best_id"),
        best.c.fair_tag.label("best_tag"),
    )


TAKE_FAIR = _take(_tasks.c.id == bindparam("best_id"), fair_tag=bindparam("head_tag"))
SWAP_TAG = (
    update(_tasks)
    .where(_tasks.c.id == bindparam("head_id"))
    .values(fair_tag=bindparam("best_tag", type_=BigInteger))
)


async def take_first(
    tx: Tx,
    models: tuple[str, ...],
    params: Mapping[str, Any],
    preferred: tuple[str, ...] = (),
    adapters: int = 0,
    *,
    fair: bool,
    postgres: bool,
) -> Mapping[str, Any] | None:
    """Take the task a worker serving ``models`` runs next, or None: the fair head
    (``fair``) or the oldest (``claim_one``); ``params`` from ``claim_params``."""
    if not fair:
        return await tx.first(claim_one(models, preferred, adapters), params)
    if postgres:
        return await tx.first(claim_fair(models, preferred, adapters), params)
    pick = await tx.first(fair_pick(models, preferred, adapters), params)
    if pick is None:
        return None
    row = await tx.first(TAKE_FAIR, {**params, **pick})
    if row is not None and pick["best_id"] != pick["head_id"]:
        await tx.run(SWAP_TAG, pick)
    return row


# The escape character of ``held_params``' LIKE patterns (not a backslash: PostgreSQL and
# SQLite read a backslash in a string literal differently).
_LIKE_ESCAPE = "/"


def _adapters_held(count: int) -> Any:
    """How many of the worker's ``count`` held adapters a task names: its model is
    ``:held_model_<i>`` and its stored request (the ``params`` JSON, as written) holds
    ``"name": <:held_name_i>`` (a ``loras`` entry; a quoted string inside another value is
    escaped there, so it cannot match)."""
    params = sql_cast(_tasks.c.params, Text)
    named: list[ColumnElement[Any]] = [
        case(
            (
                and_(
                    _tasks.c.model == bindparam(f"held_model_{i}"),
                    params.like(bindparam(f"held_name_{i}"), escape=_LIKE_ESCAPE),
                ),
                1,
            ),
            else_=0,
        )
        for i in range(count)
    ]
    return functools.reduce(lambda total, term: total + term, named)


def held_params(adapters: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``claim_one``'s parameters for the held ``(model, adapter name)`` pairs."""
    params: dict[str, str] = {}
    for i, (model, name) in enumerate(adapters):
        quoted = json.dumps(name)  # as the stored request writes it
        for special in (_LIKE_ESCAPE, "%", "_"):
            quoted = quoted.replace(special, _LIKE_ESCAPE + special)
        params[f"held_model_{i}"] = model
        params[f"held_name_{i}"] = f'%"name": {quoted}%'
    return params


@functools.lru_cache(maxsize=256)
def claim_candidates(models: tuple[str, ...], fair: bool = False) -> Select[Any]:
    """The ids of up to ``:limit`` of the runnable tasks of ``models`` that come first: the
    oldest, or those of the smallest tags (``fair``; a batch is filled in fair order)."""
    return (
        select(_tasks.c.id)
        .where(*_runnable(models))
        .order_by(_tasks.c.fair_tag if fair else _tasks.c.available_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


@functools.lru_cache(maxsize=64)
def take_ids(count: int) -> Update:
    """Take exactly ``count`` tasks by id (``:id_0`` ...; ``keys_params(ids, "id")``),
    rendered once, for the driver path: a claim of several tasks (``Lifecycle.claim``,
    ``Lifecycle.claim_more``)."""
    return _take(_keyed(count, _tasks.c.id, "id"))


@functools.lru_cache(maxsize=256)
def runnable_one(models: tuple[str, ...]) -> Select[Any]:
    """One runnable task's id, if any: the read an idle worker makes before it claims."""
    return select(_tasks.c.id).where(*_runnable(models)).limit(1)


def runnable_params(
    models: tuple[str, ...],
    now: int,
    reserve: Mapping[str, int],
    hold: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {"now": now}
    for index, model in enumerate(models):
        params[f"start_by_{index}"] = now + reserve.get(model, 0)
        params[f"ready_by_{index}"] = now - (hold or {}).get(model, 0)
    return params


def claim_params(
    models: tuple[str, ...],
    worker_id: str,
    now: int,
    lease_ms: int,
    reserve: Mapping[str, int],
    hold: Mapping[str, int] | None = None,
    preferred: tuple[str, ...] = (),
    overdue_ms: int = 0,
    adapters: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    params = runnable_params(models, now, reserve, hold)
    params.update(owner=worker_id, lease_until=now + lease_ms)
    if preferred:
        params["overdue_before"] = now - overdue_ms
        # How far past the fair head a task of a model the worker holds may go first, in
        # virtual microseconds: the time a task may wait for such a worker at most.
        params["fair_slack"] = overdue_ms * 1000
        params.update({f"preferred_{i}": model for i, model in enumerate(preferred)})
        params.update(held_params(adapters))
    return params


_held_ids = [
    _tasks.c.id.in_(bindparam("ids", expanding=True)),
    _tasks.c.status == TaskStatus.PROCESSING,
    _tasks.c.lease_owner == bindparam("owner"),
]
HEARTBEAT = (
    update(_tasks)
    .where(*_held_ids)
    .values(lease_expires_at=bindparam("until"), updated_at=bindparam("now"))
    .returning(_tasks.c.id)
)
HELD = select(_tasks.c.id).where(*_held_ids)


async def read_inputs(tx: Tx, tasks: Sequence[Task], into: dict[str, dict[str, bytes]]) -> None:
    """Put the input images ``tasks`` keep in the database into ``into``, by task id; the
    worker reads any missing here (another store, a URL) itself."""
    keys = list(
        dict.fromkeys(item["blob"] for task in tasks for item in task.inputs if "blob" in item)
    )
    if not keys:
        return
    rows = await tx.rows(read_blobs(len(keys)), keys_params(keys))
    found = {row["key"]: bytes(row["data"]) for row in rows}
    for task in tasks:
        into[task.id] = {
            item["blob"]: found[item["blob"]] for item in task.inputs if item.get("blob") in found
        }


def usage_row(row: Any, now: int, upstream_cost_micros: int | None) -> dict[str, Any]:
    """The usage line of a completed task (``row``: a Task or a returned row)."""
    charge = row.charge
    return {
        "account_id": row.account_id,
        "task_id": row.id,
        "model": row.model,
        "tier": charge["tier"],
        "output_pixels": charge["output_pixels"],
        "input_images": charge["input_images"],
        "lines": charge["lines"],
        "amount_micros": charge["total_micros"],
        "upstream_cost_micros": upstream_cost_micros,
        "created_at": now,
    }
