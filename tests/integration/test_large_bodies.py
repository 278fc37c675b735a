"""Submits carrying megabytes of input through the real app, on SQLite and PostgreSQL: the
data URL decoded from the body's bytes is stored whole, idempotent replays match on it, and
the task runs."""

from __future__ import annotations

import base64
import io
import os
from typing import Any

import httpx
from PIL import Image
from sqlalchemy import func, select

from genhook.db import Blob, Task
from tests.conftest import Harness


def noisy_png(side: int = 800) -> bytes:
    """A PNG of noise, which does not compress: about 3 bytes a pixel (1.9 MB here)."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buffer, "PNG")
    return buffer.getvalue()


def body(image: bytes, prompt: str = "black and white", escape: bool = False) -> bytes:
    encoded = base64.b64encode(image).decode()
    if escape:  # as PHP's json_encode writes it
        encoded = encoded.replace("/", "\\/")
    return (
        '{"model": "test/fake-edit", "prompt": "' + prompt + '", "size": "1024*1024", '
        '"images": ["data:image/png;base64,' + encoded + '"]}'
    ).encode()


async def post(harness: Harness, content: bytes, **headers: str) -> httpx.Response:
    return await harness.client.post(
        "/api/v1/model/generateImage",
        content=content,
        headers={**harness.headers, "Content-Type": "application/json", **headers},
    )


async def stored_input(harness: Harness, task_id: str) -> bytes:
    async with harness.state.db.read() as session:
        task = await session.get(Task, task_id)
        assert task is not None
        key = task.inputs[0]["blob"]
        data = (await session.execute(select(Blob.data).where(Blob.key == key))).scalar_one()
    return bytes(data)


async def count(harness: Harness, model: Any) -> int:
    async with harness.state.db.read() as session:
        return int((await session.execute(select(func.count()).select_from(model))).scalar_one())


async def test_a_large_image_is_stored_whole_and_runs(harness: Harness) -> None:
    image = noisy_png()
    assert len(image) > 1024 * 1024
    response = await post(harness, body(image))
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    assert await stored_input(harness, task_id) == image
    assert await harness.run_all() == 1
    assert (await harness.result(task_id))["status"] == "completed"


async def test_escaped_slashes_in_a_large_data_url(harness: Harness) -> None:
    image = noisy_png()
    response = await post(harness, body(image, escape=True))
    assert response.status_code == 200, response.text
    assert await stored_input(harness, response.json()["id"]) == image


async def test_idempotent_replay_of_a_large_submit(harness: Harness) -> None:
    image = noisy_png()
    first = await post(harness, body(image), **{"Idempotency-Key": "large-1"})
    assert first.status_code == 200, first.text
    # The same image, spelled with escaped slashes, is the same request.
    again = await post(harness, body(image, escape=True), **{"Idempotency-Key": "large-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = await post(harness, body(noisy_png()), **{"Idempotency-Key": "large-1"})
    assert other.status_code == 409
    assert await count(harness, Task) == 1 and await count(harness, Blob) == 1


async def test_refused_large_submits_write_nothing(harness: Harness) -> None:
    image = noisy_png()
    bad_size = body(image).replace(b'"1024*1024"', b'"5*5"')
    response = await post(harness, bad_size)
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "size"
    corrupt = body(image)[:-300] + b'!"]}'
    response = await post(harness, corrupt)
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"field": "images[0]", "message": "the data URL's base64 payload is not valid base64"}
    ]
    assert await count(harness, Task) == 0 and await count(harness, Blob) == 0
