"""Protocol adapters: turn a genhook job into upstream calls and the answer into outputs.

An adapter returns ``Produced``: output bytes or URLs (fetched later under the address
policy), and whatever the upstream said about cost and NSFW content.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol
from urllib.parse import quote

from genhook.engines.base import EngineJob
from genhook.engines.edit_request import EditRequest
from genhook.engines.upstream._callbacks import CallbackBox
from genhook.engines.upstream._config import QueueProtocol, UpstreamModel
from genhook.engines.upstream._http import Answer, UpstreamHttp, bad_response
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import CONTENT_TYPES, sniff_image_format

# How often a worker waiting for a queue's callback looks for it in the database.
CALLBACK_CHECK_SECONDS = 0.2
_PLACEHOLDER = re.compile(r"^\{([a-z_]+)\}$")


@dataclass
class Produced:
    # Each item is raw bytes (from base64 or a data URL) or a URL still to fetch.
    items: list[bytes | str]
    cost_usd: Decimal | None = None
    # Per output, when the upstream says.
    nsfw: list[bool] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    async def produce(self, job: EngineJob) -> Produced: ...


def pointer(document: Any, path: str) -> Any:
    """Resolve an RFC 6901 JSON pointer; None when any step is missing."""
    if path in ("", "/"):
        return document
    current = document
    for raw in path.lstrip("/").split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            if part not in current:
                return None
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
    return current


def job_path_segment(upstream_id: str) -> str:
    """The upstream's job id as one escaped path segment: an id such as ``../x?y=`` must
    not reach another path (or a query) on the upstream's host with the credential."""
    if upstream_id.strip(".") == "":
        raise bad_response(f"the upstream's job id {upstream_id[:20]!r} is not usable in a path")
    return quote(upstream_id, safe="")


def data_url(image: bytes) -> str:
    fmt = sniff_image_format(image) or "png"
    return f"data:{CONTENT_TYPES.get(fmt, 'image/png')};base64,{base64.b64encode(image).decode()}"


def decode_b64(text: str, index: int) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_response(f"output {index} from the upstream is not valid base64") from None


def output_item(value: Any, index: int) -> bytes | str:
    """One output as the upstream gave it: a URL, a data URL, or an object holding one."""
    if isinstance(value, dict):
        if isinstance(value.get("b64_json"), str):
            return decode_b64(value["b64_json"], index)
        value = value.get("url")
    if isinstance(value, str):
        if value.startswith("data:") and ";base64," in value:
            return decode_b64(value.split(";base64,", 1)[1], index)
        if value.startswith(("http://", "https://")):
            return value
    raise bad_response(f"output {index} from the upstream is neither a URL nor base64 data")


def reported_cost(model: UpstreamModel, document: Any) -> Decimal | None:
    if model.cost_pointer is None:
        return None
    value = pointer(document, model.cost_pointer)
    if value is None or isinstance(value, bool):
        return None
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        return None
    return cost if cost.is_finite() and cost >= 0 else None


def reported_nsfw(model: UpstreamModel, document: Any, count: int) -> list[bool] | None:
    if model.nsfw_pointer is None:
        return None
    value = pointer(document, model.nsfw_pointer)
    if isinstance(value, bool):
        return [value] * count
    if isinstance(value, list) and len(value) == count and all(isinstance(v, bool) for v in value):
        return list(value)
    return None


def wire_size(size: str) -> str:
    """genhook's ``1024*1024`` as the OpenAI-style ``1024x1024``."""
    return size.replace("*", "x")


class OpenAIImages:
    """``/v1/images/edits`` (multipart) when the job has images, else ``/generations``."""

    def __init__(self, model: UpstreamModel, http: UpstreamHttp) -> None:
        self.model = model
        self.http = http

    async def produce(self, job: EngineJob) -> Produced:
        request = job.request_as(EditRequest)
        common: dict[str, Any] = {
            "prompt": request.prompt,
            "size": wire_size(request.size),
            "response_format": self.model.response_format,
            "n": 1,
        }
        if self.model.upstream_model:
            common["model"] = self.model.upstream_model
        if job.images:
            form: list[tuple[str, Any, str | None, str | None]] = [
                (key, str(value), None, None) for key, value in common.items()
            ]
            name = "image" if len(job.images) == 1 else "image[]"
            for index, image in enumerate(job.images):
                fmt = sniff_image_format(image) or "png"
                form.append((name, image, f"image{index}.{fmt}", CONTENT_TYPES.get(fmt)))
            answer = await self.http.call(
                "POST", "/v1/images/edits", deadline_ms=job.deadline_ms, form=form
            )
        else:
            answer = await self.http.call(
                "POST", "/v1/images/generations", deadline_ms=job.deadline_ms, json_body=common
            )
        document = answer.json()
        data = pointer(document, "/data")
        if not isinstance(data, list) or not data:
            raise bad_response("the upstream's answer has no 'data' outputs")
        items = [output_item(value, index) for index, value in enumerate(data)]
        info: dict[str, Any] = {}
        revised = pointer(document, "/data/0/revised_prompt")
        if isinstance(revised, str):
            info["revised_prompt"] = revised
        return Produced(
            items=items,
            cost_usd=reported_cost(self.model, document),
            nsfw=reported_nsfw(self.model, document, len(items)),
            info=info,
        )


class QueueAdapter:
    """Submit, then poll the job's status until it succeeds or fails."""

    def __init__(
        self, model: UpstreamModel, http: UpstreamHttp, callbacks: CallbackBox | None = None
    ) -> None:
        assert model.queue is not None
        assert callbacks is not None or not model.queue.callback
        self.model = model
        self.queue: QueueProtocol = model.queue
        self.http = http
        self.callbacks = callbacks

    def _fill(self, value: Any, fields: dict[str, Any]) -> Any:
        if isinstance(value, dict):
            return {key: self._fill(item, fields) for key, item in value.items()}
        if isinstance(value, list):
            return [self._fill(item, fields) for item in value]
        if isinstance(value, str):
            match = _PLACEHOLDER.match(value)
            if match and match.group(1) in fields:
                return fields[match.group(1)]
        return value

    def body(self, job: EngineJob, callback_url: str | None = None) -> Any:
        request = job.request_as(EditRequest)
        fields = request.model_dump(mode="json", exclude={"images", "webhook_url"})
        if callback_url is not None:
            fields["callback_url"] = callback_url
        width, height = request.dimensions
        fields.update(width=width, height=height)
        images = [data_url(image) for image in job.images]
        fields.update(images=images, image=images[0] if images else None)
        return self._fill(self.queue.submit_body, fields)

    async def produce(self, job: EngineJob) -> Produced:
        if self.callbacks is None:
            return await self._produce(job, None)
        callback_url = await self.callbacks.open(job.task_id)
        try:
            return await self._produce(job, callback_url)
        finally:
            await self.callbacks.close(job.task_id)

    async def _wait(self, job: EngineJob, job_path: str, since: float) -> tuple[Any, float]:
        """The next document: the callback's body, or else a poll of the status path."""
        queue = self.queue
        loop = asyncio.get_running_loop()
        while self.callbacks is not None:
            await asyncio.sleep(min(CALLBACK_CHECK_SECONDS, queue.poll_interval_seconds))
            body = await self.callbacks.received(job.task_id)
            if body is not None:
                return body, since
            if queue.status_path is not None and loop.time() - since >= queue.poll_interval_seconds:
                break
        else:
            await asyncio.sleep(queue.poll_interval_seconds)
        assert queue.status_path is not None
        answer = await self.http.call(
            "GET", queue.status_path.replace("{id}", job_path), deadline_ms=job.deadline_ms
        )
        return answer.json(), loop.time()

    async def _produce(self, job: EngineJob, callback_url: str | None) -> Produced:
        queue = self.queue
        answer = await self.http.call(
            "POST",
            queue.submit_path,
            deadline_ms=job.deadline_ms,
            json_body=self.body(job, callback_url),
        )
        document = answer.json()
        upstream_id = pointer(document, queue.id_pointer)
        if not isinstance(upstream_id, (str, int)) or isinstance(upstream_id, bool):
            raise bad_response(f"the upstream's submit answer has no job id at {queue.id_pointer}")
        job_path = job_path_segment(str(upstream_id))
        since = asyncio.get_running_loop().time()
        while True:
            status = pointer(document, queue.status_pointer)
            if status in queue.succeeded:
                break
            if status in queue.failed:
                reason = pointer(document, queue.error_pointer)
                text = self.http.scrub(str(reason)) if reason else "(no reason given)"
                raise TaskFailure(
                    ErrorCode.UPSTREAM_TASK_FAILED,
                    f"the upstream job ended as {status!s:.40}: {text}",
                )
            document, since = await self._wait(job, job_path, since)
        if queue.result_path is not None:
            result: Answer = await self.http.call(
                "GET", queue.result_path.replace("{id}", job_path), deadline_ms=job.deadline_ms
            )
            document = result.json()
        found = pointer(document, queue.result_pointer)
        values = found if isinstance(found, list) else [found] if found is not None else []
        if not values:
            raise bad_response(f"the upstream's result has no outputs at {queue.result_pointer}")
        items = [output_item(value, index) for index, value in enumerate(values)]
        return Produced(
            items=items,
            cost_usd=reported_cost(self.model, document),
            nsfw=reported_nsfw(self.model, document, len(items)),
            info={"upstream_id": str(upstream_id)[:200]},
        )
