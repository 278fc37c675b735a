"""Submission: validate against the model's schema, store inputs, create the task row.

Nothing is written until every rule has passed, and the row is written last, so a rejected
submit creates nothing and charges nothing.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from genhook import metrics, tracing
from genhook.data_urls import INLINE_DATA, InlineData
from genhook.db import Database, Task, now_ms, wakeups
from genhook.db.thread_writes import ThreadWriter
from genhook.engines.base import ModelKind
from genhook.engines.edit_request import IMAGE_REFS, ImageItemsError, ImageRef, parse_image_ref
from genhook.engines.registry import PATH_KINDS, Registry, submit_paths
from genhook.errors import FieldError, Forbidden, InvalidRequest, ServiceUnavailable
from genhook.faults import RETRY_AFTER_SECONDS
from genhook.files import disk_problem
from genhook.media import (
    CONTENT_TYPES,
    aspect_problem,
    budgeted_pixels,
    declared_size,
    pixel_total_problem,
    sniff_image_format,
)
from genhook.priorities import DEFAULT as DEFAULT_PRIORITY
from genhook.priorities import NAMES, Priority, names_text, parse
from genhook.runtime.services import Services
from genhook.statuses import TaskStatus
from genhook.storage.inputs import discard_blobs, stage_inputs
from genhook.tasks.admission import Admission, request_hash
from genhook.tasks.fairness import Fairness
from genhook.tasks.group_commit import GroupCommit
from genhook.tasks.store.writes import insert_tasks, task_values, write_task_rows
from genhook.validation import describe


class GroupInserter:
    """Inserts the task rows of concurrent submits in shared transactions (``GroupCommit``).

    A submit waits for the transaction holding its row, so the id it returns is durable.
    """

    def __init__(self, db: Database, max_batch: int = 256) -> None:
        self.db = db
        self._group: GroupCommit[_Row, None] = GroupCommit(self._write, max_batch)
        self._thread_writer = ThreadWriter(db)
        # Each task's fair-queuing tag is given in the transaction that inserts it.
        self.fairness = Fairness(db.is_postgres)

    async def insert(
        self, task: Task, blobs: list[dict[str, Any]], keys: list[dict[str, Any]] | None = None
    ) -> None:
        """``keys``: the submit's ``idempotency_keys`` row, written in the same transaction."""
        if self._thread_writer.wanted(blobs):
            # Megabytes of input on SQLite: a transaction of its own, off the event loop.
            # The tag is given just before, in a short transaction of its own.
            async with self.db.transaction() as tx:
                await self.fairness.tag(tx, [task], now_ms())
            values = task_values(task)
            await self._thread_writer.run(lambda c: write_task_rows(c, values, blobs, keys or []))
            return
        await self._group.submit((task, blobs, keys or []))

    async def _write(self, rows: list[_Row]) -> list[None]:
        blobs = [blob for _, task_blobs, _ in rows for blob in task_blobs]
        keys = [key for _, _, task_keys in rows for key in task_keys]
        async with self.db.transaction() as tx:
            await self.fairness.tag(tx, [task for task, _, _ in rows], now_ms())
            await insert_tasks(tx, [task_values(task) for task, _, _ in rows], blobs, keys)
            await tx.notify(wakeups.TASKS)
        return [None] * len(rows)


_Row = tuple[Task, list[dict[str, Any]], list[dict[str, Any]]]


@dataclass
class Submitter(Services):
    def __post_init__(self) -> None:
        self._inserter = GroupInserter(self.db)
        self.admission = Admission(self.settings, self.db, self._inserter)

    async def submit(
        self,
        account_id: str,
        path_name: str,
        body: Any,
        *,
        idempotency_key: str | None = None,
        start_deadline: float | None = None,
        offload: bool = False,
        inline: InlineData | None = None,
        max_priority: int | None = None,
    ) -> Task:
        """Create a task, or return the one an earlier submit with ``idempotency_key`` made.

        ``start_deadline`` (seconds) ends the task ``timeout`` if no worker starts it in time;
        ``max_priority``: the calling key's bound on the body's ``priority`` (None: none);
        ``offload`` validates in a thread: a large body's image data takes real work.
        ``inline``: what the body's data URL placeholders stand for (``genhook.api.bodies``).
        """
        disk = disk_problem(self.settings, self.db)
        if disk is not None:  # refused before the disk is full, so tasks in flight finish
            raise ServiceUnavailable(disk, retry_after=RETRY_AFTER_SECONDS)
        digest = ""
        if idempotency_key is not None:
            if offload:
                digest = await asyncio.to_thread(request_hash, path_name, body, inline)
            else:
                digest = request_hash(path_name, body, inline)
            earlier = await self.admission.replay(account_id, idempotency_key, digest, now_ms())
            if earlier is not None:
                return earlier
        path_kind = PATH_KINDS[path_name]
        context: dict[str, Any] = {INLINE_DATA: inline}
        body, webhook_events = take_webhook_events(body)
        body, priority = take_priority(body)
        if offload:
            request = await asyncio.to_thread(self._validate, path_kind, body, context)
        else:
            request = self._validate(path_kind, body, context)
        priority = bounded_priority(priority, max_priority)
        webhook_url: str | None = getattr(request, "webhook_url", None)
        if webhook_url is not None:
            await self.policy.check_webhook_url(webhook_url)
        spec = self.registry.get(body["model"])
        assert spec is not None
        task_id = secrets.token_hex(16)
        refs = input_refs(request, context, self.settings.max_task_input_pixels)
        now = now_ms()
        inputs, blobs = input_rows(task_id, refs, now)
        deadline = self.settings.task_deadline_seconds or spec.deadline_seconds
        charge = spec.pricing(self.settings, request)
        task = Task(
            id=task_id,
            account_id=account_id,
            model=spec.id,
            kind=spec.kind.value,
            status=TaskStatus.CREATED,
            params=stored_params(request),
            inputs=inputs,
            webhook_url=webhook_url,
            webhook_events=webhook_events,
            priority=priority.level,
            created_at=now,
            updated_at=now,
            available_at=now,
            deadline_at=now + int(deadline * 1000),
            attempts=0,
            lease_losses=0,
            outputs=[],
            has_nsfw_contents=[],
            info={},
            trace_context=tracing.task_context(task_id, spec.id),
            charge={
                "tier": charge.tier,
                "output_pixels": charge.output_pixels,
                "input_images": charge.input_images,
                "lines": [[text, str(amount)] for text, amount in charge.lines],
                "total_micros": int(charge.total * 1_000_000),
            },
        )
        if start_deadline is not None:
            task.start_deadline_at = now + int(start_deadline * 1000)
        limits = await self.admission.limits(account_id)
        staged = await stage_inputs(self.storage, blobs)
        try:
            created = task
            if idempotency_key is not None or limits.active:
                created = await self.admission.insert(
                    task, [] if staged else blobs, limits, idempotency_key, digest, now
                )
            else:
                await self._inserter.insert(task, [] if staged else blobs)
        except BaseException:
            await discard_blobs(self.storage, staged)
            raise
        if created is not task:
            await discard_blobs(self.storage, staged)
        else:
            metrics.task_submitted(task.model)
        return created

    def _validate(self, path_kind: ModelKind, body: Any, context: dict[str, Any]) -> BaseModel:
        return validate_request(self.registry, path_kind, body, context)


def validate_request(
    registry: Registry, path_kind: ModelKind, body: Any, context: dict[str, Any]
) -> BaseModel:
    """``body`` checked against its model's schema on the ``path_kind`` submit path; every
    refusal is an ``InvalidRequest`` naming the field. Submit and ``genhook predict`` use it."""
    if not isinstance(body, dict):
        raise InvalidRequest(
            "the request body must be a JSON object",
            [FieldError("body", "expected a JSON object")],
        )
    model_id = body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise InvalidRequest(
            "model is required", [FieldError("model", "a model id string is required")]
        )
    spec = registry.get(model_id)
    if spec is None:
        known = ", ".join(sorted(s.id for s in registry)) or "none"
        message = f"unknown model {model_id!r}; available models: {known}"
        raise InvalidRequest(message, [FieldError("model", message)])
    if not spec.accepts(path_kind):
        paths = " or ".join(submit_paths(spec))
        message = (
            f"model {model_id!r} is a {spec.kind.value} model and is not accepted on the "
            f"{path_kind.value} path; submit it to {paths}"
        )
        raise InvalidRequest(message, [FieldError("model", message)])
    try:
        return spec.request_schema.model_validate(body, context=context)
    except ValidationError as exc:
        raise InvalidRequest("the request is invalid", field_errors(exc)) from None


def input_refs(request: BaseModel, context: dict[str, Any], pixel_budget: int) -> list[ImageRef]:
    """The request's input files in order (the schema's validators leave them in
    ``context``; else its ``images``), refused when the pictures among them declare more
    than ``pixel_budget`` pixels together."""
    refs: list[ImageRef] | None = context.get(IMAGE_REFS)
    if refs is None:
        inline = context.get(INLINE_DATA)
        refs = [parse_image_ref(item, inline) for item in getattr(request, "images", [])]
    # Each inline picture's header is read once: its shape, then the task's pixel total.
    total = 0
    for index, ref in enumerate(refs):
        size = declared_size(ref.data) if ref.data is not None and ref.format else None
        if size is None:
            continue
        shape = aspect_problem(size)
        if shape is not None:
            field = ref.field or f"images[{index}]"
            message = f"{field} {shape}"
            raise InvalidRequest(message, [FieldError(field, message)])
        assert ref.data is not None
        total += budgeted_pixels(sniff_image_format(ref.data), size)
    problem = pixel_total_problem(total, pixel_budget)
    if problem is not None:
        raise InvalidRequest(problem, [FieldError(_pictures_field(refs), problem)])
    return refs


def stored_params(request: BaseModel) -> dict[str, Any]:
    """The request as the task row keeps it, for the engine: without ``webhook_url`` and
    without the input files, whose bytes are the task's inputs. A schema whose file fields
    serialize to a short note of themselves (a predictor's: the URL, or ``data:image/png``)
    says so with ``keeps_file_fields`` and keeps them, in place."""
    if getattr(request, "keeps_file_fields", False):
        return request.model_dump(mode="json", exclude={"webhook_url"})
    return request.model_dump(mode="json", exclude={"images", "audio", "webhook_url"})


def _pictures_field(refs: list[ImageRef]) -> str:
    """The request field the pixel budget's error names: the first one holding a picture."""
    for ref in refs:
        if ref.field is not None and ref.format in CONTENT_TYPES:
            return ref.field.partition("[")[0]
    return "images"


def input_rows(
    task_id: str, refs: list[ImageRef], now: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The task's ``inputs`` entries and the blob rows of its data-URL images.

    Input images go into the database with the task row, in one transaction: nothing is
    left behind when a submit fails, and the worker on any machine can read them. They are
    deleted when the task ends. A bucket blob store keeps them instead (storage/inputs.py).
    """
    inputs: list[dict[str, Any]] = []
    blobs: list[dict[str, Any]] = []
    for index, ref in enumerate(refs):
        if ref.data is not None and ref.format is not None:
            key = f"inputs/{task_id}_{index}.{ref.format}"
            content_type = ref.content_type or CONTENT_TYPES[ref.format]
            blobs.append(
                {"key": key, "content_type": content_type, "data": ref.data, "created_at": now}
            )
            inputs.append({"blob": key, "format": ref.format})
        else:
            inputs.append({"url": ref.url})
        if ref.field is not None:
            inputs[-1]["field"] = ref.field
    return inputs, blobs


def field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + part
    return path or "body"


def field_errors(exc: ValidationError) -> list[FieldError]:
    """Turn Pydantic's errors into ``{"field": "images[3]", "message": ...}`` entries."""
    errors: list[FieldError] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, ImageItemsError):
            errors.extend(FieldError(field_path((*loc, i)), m) for i, m in cause.items)
            continue
        path = field_path(loc)
        errors.append(
            FieldError(path, describe(path, error["type"], error.get("ctx"), error["msg"]))
        )
    return errors


# The processing event is named after the state it announces.
WEBHOOK_EVENTS = (TaskStatus.PROCESSING, "terminal")


def _refuse(message: str) -> InvalidRequest:
    return InvalidRequest(message, [FieldError("webhook_events", message)])


def take_webhook_events(body: Any) -> tuple[Any, str | None]:
    """Remove ``webhook_events`` from a submit body (engines never see it) and check it.

    Returns the body and the extra events to store (``"processing"``), or None for the
    default (the terminal event only).
    """
    if not isinstance(body, dict) or "webhook_events" not in body:
        return body, None
    body = dict(body)
    raw = body.pop("webhook_events")
    if raw is None:
        return body, None
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise _refuse("webhook_events must be a list of event names")
    unknown = sorted(set(raw) - set(WEBHOOK_EVENTS))
    if unknown:
        raise _refuse(f"unknown webhook event {unknown[0]!r}; known: {', '.join(WEBHOOK_EVENTS)}")
    if len(set(raw)) != len(raw):
        raise _refuse("webhook_events lists an event twice")
    if "terminal" not in raw:
        raise _refuse("webhook_events must include terminal: the terminal event is always sent")
    if body.get("webhook_url") is None:
        raise _refuse("webhook_events needs a webhook_url")
    extra = [e for e in raw if e != "terminal"]
    return body, ",".join(extra) or None


PRIORITY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": list(NAMES),
    "default": str(DEFAULT_PRIORITY),
    "title": "Priority",
    "description": "Orders this account's own waiting tasks: high ones are taken before "
    "normal ones, normal before low (FIFO within a level). It never takes workers from "
    "another account. An API key may be bounded (max_priority): asking above its bound "
    "answers 403 naming priority; left out, a task gets normal, or the key's bound when "
    "that is lower.",
}


def with_submit_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's request schema with the fields every submit takes beside the model's own
    (``priority``), as the submit accepts them; ``schema`` is left unchanged."""
    properties = dict(schema.get("properties", {}))
    properties.setdefault("priority", PRIORITY_SCHEMA)
    return {**schema, "properties": properties}


def take_priority(body: Any) -> tuple[Any, Priority | None]:
    """Remove ``priority`` from a submit body (it orders the queue; engines never see it)
    and check it is one of the names; None when left out or null."""
    if not isinstance(body, dict) or "priority" not in body:
        return body, None
    body = dict(body)
    raw = body.pop("priority")
    if raw is None:
        return body, None
    priority = parse(raw)
    if priority is None:
        message = f"priority must be one of {names_text()}"
        raise InvalidRequest(message, [FieldError("priority", message)])
    return body, priority


def bounded_priority(asked: Priority | None, bound: int | None) -> Priority:
    """The task's priority under the API key's bound (``api_keys.max_priority``, None: no
    bound). Asking above the bound is refused (403); asking nothing gives ``normal``, or the
    bound when it is lower, so a key limited to ``low`` submits low tasks by default."""
    if asked is None:
        if bound is not None and bound < DEFAULT_PRIORITY.level:
            return Priority.of_level(bound)
        return DEFAULT_PRIORITY
    if bound is None or asked.level <= bound:
        return asked
    allowed = Priority.of_level(bound)
    message = f"priority {asked} is above this API key's bound: it may ask for {allowed} or lower"
    raise Forbidden(message, [FieldError("priority", message)])
