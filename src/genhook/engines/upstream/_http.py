"""Calls to an upstream model server: retries within the task's deadline, errors as codes.

429 and 5xx answers, timeouts and connection failures are retried with the shared backoff
(``Retry-After`` wins when the upstream sends one) for as long as the model's attempts and
the task's deadline allow; any other 4xx ends the task with the upstream's own message,
trimmed, with the credential cut out of it. The base URL is the operator's own setting, so
it is not subject to the target-address policy (self-hosted servers sit on private networks).
That is also why a redirect is not followed by default: it could lead anywhere, the
policy would not check it, and the credential would go along. An entry may allow
redirects within the base URL's origin (``follow_redirects``); the credential goes only
to that origin whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from genhook.engines.upstream._config import UpstreamModel
from genhook.errors import ErrorCode, TaskFailure
from genhook.retry import backoff_delay, parse_retry_after

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 300
REDACTED = "[redacted]"
_RETRYABLE = frozenset({408, 425, 429})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise bad_response("the upstream's answer is not valid JSON") from None


def bad_response(why: str) -> TaskFailure:
    return TaskFailure(ErrorCode.UPSTREAM_BAD_RESPONSE, why)


class UpstreamHttp:
    """One per model and worker process: a connection pool sized to the model's limit."""

    def __init__(self, model: UpstreamModel, credential: str | None) -> None:
        self.model = model
        self._credential = credential
        self._origin = URL(model.base_url).origin()
        self._headers: dict[str, str] = {}
        if credential:
            scheme = f"{model.auth_scheme} " if model.auth_scheme else ""
            self._headers[model.auth_header] = scheme + credential
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.model.concurrency)
            )
        return self._session

    def headers_for(self, url: URL) -> dict[str, str]:
        """The credential, for the base URL's own origin only."""
        return self._headers if url.origin() == self._origin else {}

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def scrub(self, text: str) -> str:
        """Trim an upstream message and cut the credential out of it."""
        if self._credential:
            text = text.replace(self._credential, REDACTED)
        text = " ".join(text.split())
        return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"

    async def call(
        self,
        method: str,
        path: str,
        *,
        deadline_ms: int | None,
        json_body: Any = None,
        form: list[tuple[str, Any, str | None, str | None]] | None = None,
    ) -> Answer:
        """One logical request, retried; ``form`` items are (name, value, filename, type)."""
        url = URL(self.model.base_url + path)
        attempt = 0
        while True:
            attempt += 1
            # Not clamped to the deadline: the worker cancels the call there, so the task
            # ends as ``timeout`` rather than as an upstream failure.
            timeout = self.model.timeout_seconds
            try:
                answer, retry_after = await self._once(method, url, timeout, json_body, form)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                reason = (
                    f"no answer within {timeout:.3g} s"
                    if isinstance(exc, TimeoutError)
                    else f"connection failed ({type(exc).__name__})"
                )
                retry_after = None
            else:
                if answer.status < 400:
                    return answer
                if answer.status < 500 and answer.status not in _RETRYABLE:
                    raise TaskFailure(
                        ErrorCode.UPSTREAM_REJECTED,
                        f"the upstream refused the request (HTTP {answer.status}): "
                        + self.message_of(answer),
                    )
                reason = f"HTTP {answer.status}: {self.message_of(answer)}"
            delay = backoff_delay(
                attempt, self.model.retry_base_seconds, self.model.retry_cap_seconds
            )
            if retry_after is not None:
                delay = retry_after
            left = None if deadline_ms is None else deadline_ms / 1000 - time.time()
            if attempt >= self.model.max_attempts or (left is not None and delay >= left):
                raise TaskFailure(
                    ErrorCode.UPSTREAM_UNAVAILABLE,
                    f"the upstream did not answer successfully after {attempt} attempt(s); "
                    f"last: {reason}",
                )
            log.info("upstream %s: attempt %d failed (%s)", self.model.id, attempt, reason)
            await asyncio.sleep(delay)

    async def _once(
        self,
        method: str,
        url: URL,
        timeout: float,
        json_body: Any,
        form: list[tuple[str, Any, str | None, str | None]] | None,
    ) -> tuple[Answer, float | None]:
        """One request and the redirects the model allows, within one ``timeout``."""
        async with asyncio.timeout(timeout):
            for _ in range(MAX_REDIRECTS + 1):
                data: aiohttp.FormData | None = None
                if form is not None:
                    data = aiohttp.FormData()
                    for name, value, filename, content_type in form:
                        data.add_field(name, value, filename=filename, content_type=content_type)
                async with self._client().request(
                    method,
                    url,
                    json=json_body if data is None else None,
                    data=data,
                    headers=self.headers_for(url),
                    allow_redirects=False,
                ) as response:
                    if response.status not in _REDIRECTS:
                        body = await self._read_capped(response)
                        retry_after = parse_retry_after(response.headers.get("Retry-After"))
                        return Answer(response.status, body), retry_after
                    url = self._redirect_target(url, response)
                if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                    method, json_body, form = "GET", None, None
        raise bad_response(f"the upstream redirected more than {MAX_REDIRECTS} times")

    def _redirect_target(self, url: URL, response: aiohttp.ClientResponse) -> URL:
        """Where a redirect may be followed to; raises for one the model does not allow."""
        status = response.status
        if self.model.follow_redirects == "none":
            raise bad_response(
                f"the upstream answered with a redirect (HTTP {status}), which this model "
                "does not follow (follow_redirects)"
            )
        location = response.headers.get("Location", "")
        try:
            target = url.join(URL(location))
        except ValueError:
            target = None
        if not location or target is None or target.origin() != self._origin:
            raise bad_response(
                f"the upstream redirected (HTTP {status}) away from its own origin, "
                "which is never followed"
            )
        return target

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        """The answer's body, refused past twice the output cap (base64 grows by a third)."""
        limit = 2 * self.model.max_output_bytes + 1024 * 1024
        if response.content_length is not None and response.content_length > limit:
            raise bad_response(f"the upstream's answer is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise bad_response(f"the upstream's answer is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def message_of(self, answer: Answer) -> str:
        """The upstream's error message: ``error.message``, ``error``, ``detail`` or the body."""
        text = answer.body[:4096].decode("utf-8", "replace")
        try:
            data = json.loads(answer.body)
        except ValueError:
            return self.scrub(text) or "(no message)"
        found: Any = None
        if isinstance(data, dict):
            error = data.get("error")
            if isinstance(error, dict):
                found = error.get("message")
            elif isinstance(error, str):
                found = error
            found = found or data.get("detail") or data.get("message")
        return self.scrub(found if isinstance(found, str) else text) or "(no message)"
