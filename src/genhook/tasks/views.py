"""The prediction response, shared by submit, polling and the webhook payload,
so a callback always carries the same shape as polling."""

from __future__ import annotations

import base64
from typing import Any

from genhook.config import Settings
from genhook.db import Task
from genhook.errors import ErrorCode
from genhook.priorities import Priority
from genhook.statuses import TaskStatus
from genhook.storage import BlobStore
from genhook.task_states import TIMEOUT_MESSAGE, UNSUCCESSFUL
from genhook.times import iso_ms as iso_ms


def result_url(settings: Settings, task_id: str) -> str:
    return f"{settings.resolved_public_base_url}/api/v1/model/result/{task_id}"


def cancel_url(settings: Settings, task_id: str) -> str:
    return f"{result_url(settings, task_id)}/cancel"


def output_url(settings: Settings, key: str) -> str:
    return f"{settings.resolved_public_base_url}/api/v1/outputs/{key}"


async def prediction_view(
    task: Task, settings: Settings, storage: BlobStore, *, for_webhook: bool = False
) -> dict[str, Any]:
    """Render ``task``; polling shows ``timeout`` as ``failed`` (polling has no ``timeout`` state),
    the webhook payload keeps ``timeout``; ``canceled`` shows as itself."""
    status = task.status
    if status == TaskStatus.TIMEOUT and not for_webhook:
        status = TaskStatus.FAILED
    outputs: list[str] = []
    nsfw: list[bool] = []
    if task.status == TaskStatus.COMPLETED:
        nsfw = [bool(flag) for flag in task.has_nsfw_contents]
        if task.params.get("enable_base64_output"):
            for key in task.outputs:
                blob = await storage.get(key)
                outputs.append(base64.b64encode(blob[0]).decode("ascii") if blob else "")
        else:
            outputs = [output_url(settings, key) for key in task.outputs]
    view: dict[str, Any] = {
        "id": task.id,
        "model": task.model,
        "status": status,
        "outputs": outputs,
        "has_nsfw_contents": nsfw,
        "created_at": iso_ms(task.created_at),
        "urls": {"get": result_url(settings, task.id), "cancel": cancel_url(settings, task.id)},
    }
    if task.status in UNSUCCESSFUL:
        view["error_code"] = task.error_code or int(ErrorCode.INTERNAL_ERROR)
        view["error"] = task.error_message or TIMEOUT_MESSAGE
    if task.priority:  # shown when not normal: unchanged for a client that never sets it
        view["priority"] = Priority.of_level(task.priority)
    if task.info:
        view["info"] = task.info
    if task.status == TaskStatus.COMPLETED and task.stt_result is not None:
        view["stt_result"] = task.stt_result
    if task.finished_at is not None:
        view["completed_at"] = iso_ms(task.finished_at)
    if task.outputs_expire_at is not None:
        view["outputs_expire_at"] = iso_ms(task.outputs_expire_at)
    return view
