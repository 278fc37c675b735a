"""A model server on loopback speaking the OpenAI-style images API and a Replicate-like queue.

It is the outside world of the upstream engine, so the tests may script it: prompt words
steer each answer (``slow``, ``busy``, ``flaky``, ``down``, ``garbled``, ``reject``,
``private-url``, ``loopback-url``, ``cost``, ``nsfw``, ``fail``, ``redirect`` within the
origin or ``redirect away`` to another one, ``sneaky-id`` for a job id that climbs paths).
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from PIL import Image

CREDENTIAL = "sk-test-7f3c9a1e5b2d4c6f8a0b"
# Not a playable file: the service stores audio outputs as the bytes the upstream gave.
MP3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 4


def png(colour: tuple[int, int, int] = (10, 120, 240), size: int = 64) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, "PNG")
    return buffer.getvalue()


@dataclass
class UpstreamServer:
    port: int = 0
    # Every request as (path, fields), fields being the form or JSON body without images.
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    delay: float = 0.0
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # The raw path of every request, and (host, Authorization) of every redirected one.
    raw_paths: list[str] = field(default_factory=list)
    redirected: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            self.raw_paths.append(request.raw_path)
            if "moved" in request.query:
                self.redirected.append((request.host, request.headers.get("Authorization")))
            response: web.StreamResponse = await handler(request)
            return response

        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[record])
        app.router.add_post("/v1/images/edits", self.edits)
        app.router.add_post("/v1/images/generations", self.generations)
        app.router.add_post("/queue/submit", self.submit)
        app.router.add_get("/queue/jobs/{id}", self.status)
        app.router.add_get("/files/{name}", self.file)
        app.router.add_get("/steal", self.file)
        return app

    async def edits(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        fields: dict[str, Any] = {}
        images = 0
        for key, value in form.items():
            if isinstance(value, web.FileField):
                images += 1
                assert value.file.read()[:4] == b"\x89PNG"
            else:
                fields[key] = str(value)
        fields["images"] = images
        return await self._answer(request, "/v1/images/edits", fields)

    async def generations(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, "/v1/images/generations", await request.json())

    async def _answer(
        self, request: web.Request, path: str, fields: dict[str, Any]
    ) -> web.StreamResponse:
        self.requests.append((path, fields))
        auth = request.headers.get("Authorization")
        self.authorizations.append(auth)
        if auth != f"Bearer {CREDENTIAL}":
            message = f"Incorrect API key provided: {auth}"
            return web.json_response({"error": {"message": message}}, status=401)
        words = str(fields.get("prompt", "")).split()
        if "redirect" in words and "moved" not in request.query:
            host = "localhost" if "away" in words else "127.0.0.1"
            location = f"http://{host}:{self.port}{path}?moved=1"
            return web.Response(status=307, headers={"Location": location})
        prompt = " ".join(words)
        count = self.attempts[prompt] = self.attempts.get(prompt, 0) + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if "slow" in words:
                await asyncio.wait_for(self.release.wait(), 30)
            if "busy" in words and count <= 2:
                return web.json_response(
                    {"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"}
                )
            if "flaky" in words and count == 1:
                return web.Response(status=500, text="upstream exploded")
            if "down" in words:
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            if "garbled" in words:
                return web.Response(text='{"data": [', content_type="application/json")
            if "reject" in words:
                message = f"prompt rejected by the safety system (key {CREDENTIAL})" + " x" * 400
                return web.json_response({"error": {"message": message}}, status=400)
            item: dict[str, Any]
            if "private-url" in words:
                item = {"url": "http://169.254.169.254/latest/meta-data/out.png"}
            elif "loopback-url" in words or fields.get("response_format") == "url":
                item = {"url": f"{self.base_url}/files/out.png"}
            else:
                item = {"b64_json": base64.b64encode(png()).decode(), "revised_prompt": prompt}
            body: dict[str, Any] = {"created": 1, "data": [item]}
            if "cost" in words:
                body["usage"] = {"cost_usd": 0.0123}
            if "nsfw" in words:
                body["nsfw"] = [True]
            return web.json_response(body)
        finally:
            self.in_flight -= 1

    async def submit(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("/queue/submit", body))
        self.authorizations.append(request.headers.get("Authorization"))
        job_id = f"job-{next(self._ids)}"
        if "sneaky-id" in str(body.get("input", {}).get("prompt", "")).split():
            job_id = "../../../steal?x="
        self.jobs[job_id] = {"body": body, "polls": 0}
        return web.json_response({"id": job_id, "status": "starting"}, status=201)

    async def status(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["id"]
        job = self.jobs.get(job_id)
        if job is None:
            return web.json_response({"detail": "not found"}, status=404)
        job["polls"] += 1
        prompt = str(job["body"]["input"]["prompt"])
        if job["polls"] < 2:
            return web.json_response({"id": job_id, "status": "processing"})
        if "fail" in prompt.split():
            return web.json_response(
                {"id": job_id, "status": "failed", "error": "CUDA out of memory"}
            )
        return web.json_response(
            {
                "id": job_id,
                "status": "succeeded",
                "output": [f"{self.base_url}/files/{job['body'].get('file', 'out.png')}"],
                "metrics": {"cost": "0.0042"},
            }
        )

    async def file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["name"].endswith(".mp3"):
            return web.Response(body=MP3, content_type="audio/mpeg")
        return web.Response(body=png((250, 250, 10)), content_type="image/png")


@asynccontextmanager
async def running_upstream() -> AsyncIterator[UpstreamServer]:
    server = UpstreamServer()
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)


@contextmanager
def upstream_in_thread() -> Iterator[UpstreamServer]:
    """The server on its own loop in a thread, for tests that block (a live service)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        holder["stop"] = asyncio.Event()
        async with running_upstream() as server:
            holder["server"] = server
            ready.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the upstream server did not start")
        yield holder["server"]
    finally:
        if "stop" in holder:
            loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
        loop.close()
