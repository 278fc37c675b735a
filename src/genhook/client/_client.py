"""The API client, sync (``Client``) and async (``AsyncClient``), over httpx.

Both share ``_Core``: request building, retry decisions and answer parsing live once, and
only the I/O differs. Retries follow one rule: a request is re-sent only when the service
cannot have acted on it, i.e. idempotent reads on any transport error or 5xx, and any
request (submits included) when the connection was never made or the answer was 429.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, Self
from urllib.parse import quote

import httpx

from genhook import __version__
from genhook.client._errors import APIConnectionError, WaitTimeout, error_from_response
from genhook.client._images import ImageInput, image_items
from genhook.client._models import Prediction, Usage
from genhook.retry import backoff_delay, parse_retry_after

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
EDIT_MODEL = "genhook/image-edit"
Kind = Literal["image", "video", "audio"]
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

OnUpdate = Callable[[Prediction], None]


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
        self.api_key = api_key if api_key is not None else os.environ.get("GENHOOK_API_KEY")
        self.base_url = (base_url or os.environ.get("GENHOOK_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
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
    """Synchronous client. ``api_key`` defaults to ``$GENHOOK_API_KEY``, ``base_url`` to
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
        self, method: str, path: str, *, body: Any = None, idempotent: bool, auth: bool = True
    ) -> Any:
        headers = self._headers() if auth else {"Accept": "application/json"}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, self._url(path), json=body, headers=headers)
            except httpx.TransportError as exc:
                if self._retry_error(exc, idempotent, attempt):
                    time.sleep(self._delay(attempt, None))
                    continue
                raise APIConnectionError(f"{method} {self._url(path)} failed: {exc!r}") from exc
            if self._retry_status(response.status_code, idempotent, attempt):
                time.sleep(self._delay(attempt, response))
                continue
            return self._parse(response)

    def submit(self, model: str, /, *, kind: Kind = "image", **fields: Any) -> Prediction:
        """Submit any model's task; ``fields`` are its request body beside ``model``."""
        body = {"model": model, **fields}
        return self._prediction(
            self._request("POST", _SUBMIT_PATHS[kind], body=body, idempotent=False)
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
        }
        body = self._edit_body(prompt, images, model, optional, extra)
        return self._prediction(
            self._request("POST", _SUBMIT_PATHS["image"], body=body, idempotent=False)
        )

    def result(self, task_id: str) -> Prediction:
        path = f"/api/v1/model/result/{quote(task_id, safe='')}"
        return self._prediction(self._request("GET", path, idempotent=True))

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
        self, method: str, path: str, *, body: Any = None, idempotent: bool, auth: bool = True
    ) -> Any:
        headers = self._headers() if auth else {"Accept": "application/json"}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    method, self._url(path), json=body, headers=headers
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

    async def submit(self, model: str, /, *, kind: Kind = "image", **fields: Any) -> Prediction:
        body = {"model": model, **fields}
        return self._prediction(
            await self._request("POST", _SUBMIT_PATHS[kind], body=body, idempotent=False)
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
        **extra: Any,
    ) -> Prediction:
        optional = {
            "size": size,
            "output_format": output_format,
            "thinking": thinking,
            "prompt_optimization_mode": prompt_optimization_mode,
            "enable_base64_output": enable_base64_output,
            "webhook_url": webhook_url,
        }
        # Reading and encoding files is blocking work; keep it off the event loop.
        body = await asyncio.to_thread(self._edit_body, prompt, images, model, optional, extra)
        return self._prediction(
            await self._request("POST", _SUBMIT_PATHS["image"], body=body, idempotent=False)
        )

    async def result(self, task_id: str) -> Prediction:
        path = f"/api/v1/model/result/{quote(task_id, safe='')}"
        return self._prediction(await self._request("GET", path, idempotent=True))

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

    async def jwks(self) -> dict[str, Any]:
        data = await self._request("GET", "/api/v1/webhooks/jwks.json", idempotent=True, auth=False)
        return data if isinstance(data, dict) else {"keys": []}
