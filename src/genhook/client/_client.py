"""The API client, sync (``Client``) and async (``AsyncClient``), over httpx.

Both share ``_Core``: request building, retry decisions and answer parsing live once, and
only the I/O differs. Retries follow one rule: a request is re-sent only when the service
cannot have acted on it, i.e. idempotent reads on any transport error or 5xx, and any
request (submits included) when the connection was never made or the answer was 429.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Literal, Self
from urllib.parse import quote, urlencode

import httpx

from genhook import __version__
from genhook.client._credentials import DEFAULT_BASE_URL, local_credentials
from genhook.client._errors import APIConnectionError, WaitTimeout, error_from_response
from genhook.client._images import ImageInput, image_items, media_fields
from genhook.client._models import (
    ModelInfo,
    Prediction,
    TaskEvent,
    TaskPage,
    Usage,
    lora,
    model_list,
)
from genhook.client._sse import SSEDecoder
from genhook.priorities import Priority
from genhook.retry import backoff_delay, parse_retry_after

EDIT_MODEL = "genhook/image-edit"
Kind = Literal["image", "video", "audio"]
# A task's priority: a ``Priority`` or its name.
PriorityArg = Priority | Literal["high", "normal", "low"]
_SUBMIT_PATHS: dict[str, str] = {
    "image": "/api/v1/model/generateImage",
    "video": "/api/v1/model/generateVideo",
    "audio": "/api/v1/model/generateAudio",
}
_RETRY_STATUSES_IDEMPOTENT = frozenset({429, 500, 502, 503, 504})
_RETRY_STATUSES_UNSAFE = frozenset({429})
# Errors that prove no byte of the request reached the service.
_NOT_SENT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
_MAX_RETRY_AFTER = 60.0
# The service sends a comment at least every 15 s on an idle event stream.
_STREAM_READ_TIMEOUT = 60.0

OnUpdate = Callable[[Prediction], None]


def _model_path(model_id: str) -> str:
    # Model ids hold a slash (owner/name), which the route takes as part of the path.
    return "/api/v1/models/" + quote(model_id, safe="/")


class _Core:
    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        retry_backoff: float,
        retry_backoff_cap: float,
    ) -> None:
        self.base_url = (base_url or os.environ.get("GENHOOK_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.api_key = api_key if api_key is not None else os.environ.get("GENHOOK_API_KEY")
        if not self.api_key:
            # The CLI's lookup: the key `genhook serve` wrote, for a service on this machine.
            found = local_credentials(self.base_url)
            self.api_key = str(found[0]["api_key"]) if found else None
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.retry_backoff_cap = retry_backoff_cap

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": f"genhook-python/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _retry_error(self, exc: httpx.TransportError, idempotent: bool, attempt: int) -> bool:
        if attempt > self.max_retries:
            return False
        return idempotent or isinstance(exc, _NOT_SENT_ERRORS)

    def _retry_status(self, status: int, idempotent: bool, attempt: int) -> bool:
        if attempt > self.max_retries:
            return False
        allowed = _RETRY_STATUSES_IDEMPOTENT if idempotent else _RETRY_STATUSES_UNSAFE
        return status in allowed

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if retry_after is not None:
                return min(retry_after, _MAX_RETRY_AFTER)
        return backoff_delay(attempt, self.retry_backoff, self.retry_backoff_cap)

    def _wait_options(self, wait: float | None) -> tuple[dict[str, str], float]:
        """The ``Prefer: wait`` header and a read timeout that outlasts the wait."""
        if wait is None:
            return {}, self.timeout
        seconds = max(0, math.ceil(wait))
        return {"Prefer": f"wait={seconds}"}, self.timeout + seconds

    @staticmethod
    def _result_path(task_id: str, logs: bool) -> str:
        return f"/api/v1/model/result/{quote(task_id, safe='')}" + ("?logs=1" if logs else "")

    def _events_request(self, task_id: str, last_event_id: str | None) -> dict[str, Any]:
        headers = self._headers()
        headers["Accept"] = "text/event-stream"
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        return {
            "method": "GET",
            "url": self._url(f"/api/v1/model/result/{quote(task_id, safe='')}/events"),
            "headers": headers,
            "timeout": httpx.Timeout(self.timeout, read=_STREAM_READ_TIMEOUT),
        }

    def _stream_retry(self, failures: int, what: str) -> float:
        """Seconds before reconnecting a broken stream; raise once retries are spent."""
        if failures > self.max_retries:
            raise APIConnectionError(f"the event stream of {what} broke {failures} times")
        return backoff_delay(failures, self.retry_backoff, self.retry_backoff_cap)

    @staticmethod
    def _tasks_path(
        status: str | Iterable[str] | None,
        model: str | None,
        since: str | None,
        limit: int | None,
        cursor: str | None,
    ) -> str:
        query: dict[str, str] = {}
        if status is not None:
            query["status"] = status if isinstance(status, str) else ",".join(status)
        if model is not None:
            query["model"] = model
        if since is not None:
            query["since"] = since
        if limit is not None:
            query["limit"] = str(limit)
        if cursor is not None:
            query["cursor"] = cursor
        return "/api/v1/model/results" + (f"?{urlencode(query)}" if query else "")

    @staticmethod
    def _submit_headers(
        idempotency_key: str | None, start_deadline: float | None
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if start_deadline is not None:
            headers["X-Start-Deadline"] = f"{start_deadline:g}"
        return headers

    @staticmethod
    def _cancel_path(task_id: str) -> str:
        return f"/api/v1/model/result/{quote(task_id, safe='')}/cancel"

    @staticmethod
    def _usage_path(limit: int, cursor: int | None) -> str:
        query = f"limit={limit}" + (f"&cursor={cursor}" if cursor is not None else "")
        return f"/api/v1/usage?{query}"

    @staticmethod
    def _parse(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content)
        try:
            return response.json()
        except ValueError as exc:
            raise error_from_response(502, response.content) from exc

    @staticmethod
    def _prediction(data: Any) -> Prediction:
        if not isinstance(data, dict):
            raise error_from_response(502, b"the service answered with a non-object body")
        return Prediction.from_json(data)

    @staticmethod
    def _edit_body(
        prompt: str,
        images: ImageInput | Iterable[ImageInput],
        model: str,
        optional: dict[str, Any],
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": prompt, "images": image_items(images)}
        # Unset options are left out so the service's documented defaults apply.
        body.update({k: v for k, v in optional.items() if v is not None})
        body.update(extra)
        return body

    @staticmethod
    def _wait_step(
        prediction: Prediction,
        started: float,
        timeout: float | None,
        polls: int,
        poll_interval: float,
        max_poll_interval: float,
    ) -> float:
        """Seconds to sleep before the next poll; raise ``WaitTimeout`` when time is up."""
        delay = backoff_delay(polls, poll_interval, max_poll_interval)
        if timeout is None:
            return delay
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0:
            raise WaitTimeout(
                f"task {prediction.id} still {prediction.status or 'unknown'} after {timeout:g} s",
                prediction,
            )
        return min(delay, remaining)


class Client(_Core):
    """Synchronous client. ``api_key`` defaults to ``$GENHOOK_API_KEY``, else, for a service on
    this machine, to the key in ``$GENHOOK_DATA_DIR/credentials.json`` or
    ``./genhook-data/credentials.json`` (as the CLI finds it); ``base_url`` to
    ``$GENHOOK_BASE_URL`` or ``http://127.0.0.1:8000``."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        retry_backoff_cap: float = 8.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(api_key, base_url, timeout, max_retries, retry_backoff, retry_backoff_cap)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        idempotent: bool,
        auth: bool = True,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        sent = {**(self._headers() if auth else {"Accept": "application/json"}), **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    method,
                    self._url(path),
                    json=body,
                    headers=sent,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                if self._retry_error(exc, idempotent, attempt):
                    time.sleep(self._delay(attempt, None))
                    continue
                raise APIConnectionError(f"{method} {self._url(path)} failed: {exc!r}") from exc
            if self._retry_status(response.status_code, idempotent, attempt):
                time.sleep(self._delay(attempt, response))
                continue
            return self._parse(response)

    def submit(
        self,
        model: str,
        /,
        *,
        kind: Kind = "image",
        wait: float | None = None,
        idempotency_key: str | None = None,
        start_deadline: float | None = None,
        priority: PriorityArg | None = None,
        **fields: Any,
    ) -> Prediction:
        """Submit any model's task; ``fields`` are its request body beside ``model``
        (``loras`` may list ``"NAME:SCALE"`` strings, see ``genhook.client.lora``).

        With ``idempotency_key`` a retry can never create a second task, so the submit is
        retried like a read; ``start_deadline`` (seconds) ends it ``timeout`` if it has not
        started by then. ``wait`` (seconds, at most 60) answers once the task ends
        or the wait runs out, so a short task needs no polling. A media field (``images``,
        ``audio``, ``video``...) takes local files as ``edit()`` does: a ``Path``, an existing
        file's path as a string, bytes or a PIL image, sent as a data URL. ``priority``
        (``high``, ``normal``, ``low``) orders the account's own waiting tasks.
        """
        body = {"model": model, **media_fields(_with_loras(fields)), **_priority(priority)}
        headers, timeout = self._wait_options(wait)
        return self._prediction(
            self._request(
                "POST",
                _SUBMIT_PATHS[kind],
                body=body,
                idempotent=idempotency_key is not None,
                headers={**headers, **self._submit_headers(idempotency_key, start_deadline)},
                timeout=timeout,
            )
        )

    def edit(
        self,
        prompt: str,
        images: ImageInput | Iterable[ImageInput],
        *,
        size: str | None = None,
        output_format: Literal["jpeg", "png"] | None = None,
        thinking: Literal["enabled", "disabled"] | None = None,
        prompt_optimization_mode: Literal["standard", "fast"] | None = None,
        enable_base64_output: bool | None = None,
        webhook_url: str | None = None,
        model: str = EDIT_MODEL,
        wait: float | None = None,
        idempotency_key: str | None = None,
        start_deadline: float | None = None,
        priority: PriorityArg | None = None,
        **extra: Any,
    ) -> Prediction:
        """Submit an image edit; images may be paths, bytes, PIL images or URLs."""
        optional = {
            "size": size,
            "output_format": output_format,
            "thinking": thinking,
            "prompt_optimization_mode": prompt_optimization_mode,
            "enable_base64_output": enable_base64_output,
            "webhook_url": webhook_url,
            "priority": str(priority) if priority is not None else None,
        }
        body = self._edit_body(prompt, images, model, optional, extra)
        headers, timeout = self._wait_options(wait)
        return self._prediction(
            self._request(
                "POST",
                _SUBMIT_PATHS["image"],
                body=body,
                idempotent=idempotency_key is not None,
                headers={**headers, **self._submit_headers(idempotency_key, start_deadline)},
                timeout=timeout,
            )
        )

    def cancel(self, task_id: str) -> Prediction:
        """Cancel a task that has not ended; ``Conflict`` (409) when it already had."""
        return self._prediction(self._request("POST", self._cancel_path(task_id), idempotent=False))

    def result(self, task_id: str, *, wait: float | None = None, logs: bool = False) -> Prediction:
        """The task now, or once it ends within ``wait`` seconds; ``logs`` adds its log lines."""
        headers, timeout = self._wait_options(wait)
        path = self._result_path(task_id, logs)
        return self._prediction(
            self._request("GET", path, idempotent=True, headers=headers, timeout=timeout)
        )

    def events(self, task_id: str, *, last_event_id: str | None = None) -> Iterator[TaskEvent]:
        """The task's events as they happen, ending with the terminal one; a broken
        connection is resumed from the last event received (``Last-Event-ID``)."""
        failures = 0
        while True:
            try:
                with self._http.stream(**self._events_request(task_id, last_event_id)) as response:
                    if response.status_code >= 400:
                        response.read()
                        if response.status_code < 500:
                            self._parse(response)
                        raise httpx.RemoteProtocolError(f"HTTP {response.status_code}")
                    decoder = SSEDecoder()
                    for line in response.iter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        last_event_id = event.id
                        yield event
                        if event.done:
                            return
                failures += 1
                time.sleep(self._stream_retry(failures, task_id))
            except httpx.TransportError:
                failures += 1
                time.sleep(self._stream_retry(failures, task_id))

    def tasks(
        self,
        *,
        status: str | Iterable[str] | None = None,
        model: str | None = None,
        since: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of the account's tasks, newest first; follow ``TaskPage.next_cursor``."""
        path = self._tasks_path(status, model, since, limit, cursor)
        data = self._request("GET", path, idempotent=True)
        return TaskPage.from_json(data if isinstance(data, dict) else {})

    def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
        on_update: OnUpdate | None = None,
    ) -> Prediction:
        """Poll until the task is terminal; ``on_update`` sees every poll (for progress)."""
        started = time.monotonic()
        polls = 0
        while True:
            prediction = self.result(task_id)
            polls += 1
            if on_update is not None:
                on_update(prediction)
            if prediction.done:
                return prediction
            time.sleep(
                self._wait_step(
                    prediction, started, timeout, polls, poll_interval, max_poll_interval
                )
            )

    def usage(self, *, limit: int = 100, cursor: int | None = None) -> Usage:
        """One page of billed usage; follow ``Usage.next_cursor`` for more."""
        data = self._request("GET", self._usage_path(limit, cursor), idempotent=True)
        return Usage.from_json(data if isinstance(data, dict) else {})

    def models(self) -> list[ModelInfo]:
        """Every model the service runs, with its request schema, price and deadline."""
        return model_list(self._request("GET", "/api/v1/models", idempotent=True))

    def model(self, model_id: str) -> ModelInfo:
        """One model of the catalogue; ``NotFound`` when the service has no such model."""
        data = self._request("GET", _model_path(model_id), idempotent=True)
        return ModelInfo.from_json(data if isinstance(data, dict) else {})

    def jwks(self) -> dict[str, Any]:
        """The public webhook signing keys (no API key needed)."""
        data = self._request("GET", "/api/v1/webhooks/jwks.json", idempotent=True, auth=False)
        return data if isinstance(data, dict) else {"keys": []}


class AsyncClient(_Core):
    """The asyncio twin of ``Client``; same arguments, awaitable methods."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        retry_backoff_cap: float = 8.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(api_key, base_url, timeout, max_retries, retry_backoff, retry_backoff_cap)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        idempotent: bool,
        auth: bool = True,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        sent = {**(self._headers() if auth else {"Accept": "application/json"}), **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    method,
                    self._url(path),
                    json=body,
                    headers=sent,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                if self._retry_error(exc, idempotent, attempt):
                    await asyncio.sleep(self._delay(attempt, None))
                    continue
                raise APIConnectionError(f"{method} {self._url(path)} failed: {exc!r}") from exc
            if self._retry_status(response.status_code, idempotent, attempt):
                await asyncio.sleep(self._delay(attempt, response))
                continue
            return self._parse(response)

    async def submit(
        self,
        model: str,
        /,
        *,
        kind: Kind = "image",
        wait: float | None = None,
        idempotency_key: str | None = None,
        start_deadline: float | None = None,
        priority: PriorityArg | None = None,
        **fields: Any,
    ) -> Prediction:
        # Reading and encoding files is blocking work; keep it off the event loop.
        body = {
            "model": model,
            **await asyncio.to_thread(media_fields, _with_loras(fields)),
            **_priority(priority),
        }
        headers, timeout = self._wait_options(wait)
        return self._prediction(
            await self._request(
                "POST",
                _SUBMIT_PATHS[kind],
                body=body,
                idempotent=idempotency_key is not None,
                headers={**headers, **self._submit_headers(idempotency_key, start_deadline)},
                timeout=timeout,
            )
        )

    async def edit(
        self,
        prompt: str,
        images: ImageInput | Iterable[ImageInput],
        *,
        size: str | None = None,
        output_format: Literal["jpeg", "png"] | None = None,
        thinking: Literal["enabled", "disabled"] | None = None,
        prompt_optimization_mode: Literal["standard", "fast"] | None = None,
        enable_base64_output: bool | None = None,
        webhook_url: str | None = None,
        model: str = EDIT_MODEL,
        wait: float | None = None,
        idempotency_key: str | None = None,
        start_deadline: float | None = None,
        priority: PriorityArg | None = None,
        **extra: Any,
    ) -> Prediction:
        optional = {
            "size": size,
            "output_format": output_format,
            "thinking": thinking,
            "prompt_optimization_mode": prompt_optimization_mode,
            "enable_base64_output": enable_base64_output,
            "webhook_url": webhook_url,
            "priority": str(priority) if priority is not None else None,
        }
        # Reading and encoding files is blocking work; keep it off the event loop.
        body = await asyncio.to_thread(self._edit_body, prompt, images, model, optional, extra)
        headers, timeout = self._wait_options(wait)
        return self._prediction(
            await self._request(
                "POST",
                _SUBMIT_PATHS["image"],
                body=body,
                idempotent=idempotency_key is not None,
                headers={**headers, **self._submit_headers(idempotency_key, start_deadline)},
                timeout=timeout,
            )
        )

    async def cancel(self, task_id: str) -> Prediction:
        return self._prediction(
            await self._request("POST", self._cancel_path(task_id), idempotent=False)
        )

    async def result(
        self, task_id: str, *, wait: float | None = None, logs: bool = False
    ) -> Prediction:
        headers, timeout = self._wait_options(wait)
        path = self._result_path(task_id, logs)
        return self._prediction(
            await self._request("GET", path, idempotent=True, headers=headers, timeout=timeout)
        )

    async def events(
        self, task_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[TaskEvent]:
        failures = 0
        while True:
            try:
                request = self._events_request(task_id, last_event_id)
                async with self._http.stream(**request) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        if response.status_code < 500:
                            self._parse(response)
                        raise httpx.RemoteProtocolError(f"HTTP {response.status_code}")
                    decoder = SSEDecoder()
                    async for line in response.aiter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        last_event_id = event.id
                        yield event
                        if event.done:
                            return
                failures += 1
                await asyncio.sleep(self._stream_retry(failures, task_id))
            except httpx.TransportError:
                failures += 1
                await asyncio.sleep(self._stream_retry(failures, task_id))

    async def tasks(
        self,
        *,
        status: str | Iterable[str] | None = None,
        model: str | None = None,
        since: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        path = self._tasks_path(status, model, since, limit, cursor)
        data = await self._request("GET", path, idempotent=True)
        return TaskPage.from_json(data if isinstance(data, dict) else {})

    async def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
        on_update: OnUpdate | None = None,
    ) -> Prediction:
        started = time.monotonic()
        polls = 0
        while True:
            prediction = await self.result(task_id)
            polls += 1
            if on_update is not None:
                on_update(prediction)
            if prediction.done:
                return prediction
            await asyncio.sleep(
                self._wait_step(
                    prediction, started, timeout, polls, poll_interval, max_poll_interval
                )
            )

    async def usage(self, *, limit: int = 100, cursor: int | None = None) -> Usage:
        data = await self._request("GET", self._usage_path(limit, cursor), idempotent=True)
        return Usage.from_json(data if isinstance(data, dict) else {})

    async def models(self) -> list[ModelInfo]:
        return model_list(await self._request("GET", "/api/v1/models", idempotent=True))

    async def model(self, model_id: str) -> ModelInfo:
        data = await self._request("GET", _model_path(model_id), idempotent=True)
        return ModelInfo.from_json(data if isinstance(data, dict) else {})

    async def jwks(self) -> dict[str, Any]:
        data = await self._request("GET", "/api/v1/webhooks/jwks.json", idempotent=True, auth=False)
        return data if isinstance(data, dict) else {"keys": []}


def _priority(priority: PriorityArg | None) -> dict[str, str]:
    """The body's ``priority`` field, left out when not given (the service's default)."""
    return {} if priority is None else {"priority": str(priority)}


def _with_loras(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with a ``loras`` list's ``"NAME:SCALE"`` strings as the request's objects."""
    loras = fields.get("loras")
    if isinstance(loras, list | tuple):
        return {**fields, "loras": [lora(item) for item in loras]}
    return fields
