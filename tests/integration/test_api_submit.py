"""Submit validation and auth through the real app, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from genhook.accounts import create_key, revoke_key
from genhook.db import Task
from genhook.engines.edit_request import ALLOWED_SIZES
from tests.conftest import Harness
from tests.support.images import data_url, image_bytes

MODEL = "test/fake-edit"


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "prompt": "make it pop", "images": [data_url()]}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


async def task_count(h: Harness) -> int:
    async with h.state.db.read() as session:
        return int((await session.execute(select(func.count()).select_from(Task))).scalar_one())


def fields(response: Any) -> dict[str, str]:
    data = response.json()
    assert data["code"] == response.status_code
    assert isinstance(data["message"], str) and data["message"]
    return {e["field"]: e["message"] for e in data["errors"]}


async def test_submit_returns_prediction_at_once(harness: Harness) -> None:
    response = await harness.submit(body())
    assert response.status_code == 200, response.text
    data = response.json()
    assert len(data["id"]) == 32
    assert data["model"] == MODEL
    assert data["status"] == "created"
    assert data["outputs"] == [] and data["has_nsfw_contents"] == []
    assert data["created_at"].endswith("Z")
    assert data["urls"]["get"] == f"http://testserver/api/v1/model/result/{data['id']}"
    assert (await harness.result(data["id"]))["status"] == "created"


async def test_ids_are_unguessable_and_distinct(harness: Harness) -> None:
    ids = {(await harness.submit(body())).json()["id"] for _ in range(5)}
    assert len(ids) == 5


@pytest.mark.parametrize("size", ALLOWED_SIZES)
async def test_every_allowed_size_is_accepted(harness: Harness, size: str) -> None:
    response = await harness.submit(body(size=size))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("size", "reason"),
    [
        ("1000*1000", "1048576 to 4194304"),
        ("4096*4096", "1048576 to 4194304"),
        ("8192*256", "aspect ratio"),
        ("1280*1024", "must be one of"),
        ("2048x2048", "WIDTH*HEIGHT"),
        ("", "WIDTH*HEIGHT"),
        ("0*0", "WIDTH*HEIGHT"),
        ("-2048*2048", "WIDTH*HEIGHT"),
    ],
)
async def test_bad_sizes_are_rejected(harness: Harness, size: str, reason: str) -> None:
    response = await harness.submit(body(size=size))
    assert response.status_code == 400
    assert reason in fields(response)["size"]
    assert await task_count(harness) == 0


@pytest.mark.parametrize("size", ["1000*1000", "8192*256", "1280*1024", "2048x2048", ""])
async def test_a_bad_size_lists_every_allowed_size_at_once(harness: Harness, size: str) -> None:
    response = await harness.submit(body(size=size))
    assert response.status_code == 400
    message = fields(response)["size"]
    assert message.endswith("size must be one of: " + ", ".join(ALLOWED_SIZES)), message


async def test_raw_base64_is_told_to_use_a_data_url(harness: Harness) -> None:
    raw = base64.b64encode(image_bytes(fmt="JPEG")).decode()
    response = await harness.submit(body(images=[data_url(), raw]))
    assert response.status_code == 400
    message = fields(response)["images[1]"]
    assert "raw base64" in message and "data:image/jpeg;base64," in message
    assert "4096" not in message
    assert await task_count(harness) == 0


# Bodies that hit every kind of schema error: none may answer in Pydantic's own words.
SCHEMA_ERRORS: list[dict[str, Any]] = [
    body(prompt=""),
    body(prompt=5),
    body(prompt="x" * 20_001),
    body(images=[]),
    body(images=[data_url()] * 11),
    body(images="http://x/a.png"),
    body(images=[5]),
    body(output_format="gif"),
    body(thinking="maybe"),
    body(enable_base64_output="true"),
    body(size=2048),
    body(surprise=1),
    body(webhook_url=5),
    {"model": MODEL},
    {"model": 5, "prompt": "x", "images": [data_url()]},
]


@pytest.mark.parametrize("payload", SCHEMA_ERRORS)
async def test_messages_are_in_the_services_words(
    harness: Harness, payload: dict[str, Any]
) -> None:
    response = await harness.submit(payload)
    assert response.status_code == 400, response.text
    for field, message in fields(response).items():
        assert field.split("[")[0].split(".")[0] in message or message.startswith("size"), (
            field,
            message,
        )
        for pydantic_word in ("should", "Input ", "String ", "List ", "valid string"):
            assert pydantic_word not in message, message


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x" * 20_001}, "prompt"),
        ({"images": []}, "images"),
        ({"images": [data_url()] * 11}, "images"),
        ({"images": "http://x/a.png"}, "images"),
        ({"images": [5]}, "images[0]"),
        ({"output_format": "gif"}, "output_format"),
        ({"thinking": "maybe"}, "thinking"),
        ({"prompt_optimization_mode": "turbo"}, "prompt_optimization_mode"),
        ({"enable_base64_output": "true"}, "enable_base64_output"),
        ({"size": 2048}, "size"),
        ({"surprise": 1}, "surprise"),
        ({"webhook_url": 5}, "webhook_url"),
    ],
)
async def test_each_field_rule(harness: Harness, override: dict[str, Any], field: str) -> None:
    response = await harness.submit(body(**override))
    assert response.status_code == 400, response.text
    assert field in fields(response)
    assert await task_count(harness) == 0


async def test_missing_required_fields(harness: Harness) -> None:
    response = await harness.submit({"model": MODEL})
    assert response.status_code == 400
    assert set(fields(response)) == {"prompt", "images"}
    response = await harness.submit({"prompt": "x", "images": [data_url()]})
    assert response.status_code == 400
    assert "model" in fields(response)


async def test_image_items_are_reported_by_index(harness: Harness) -> None:
    images = [
        data_url(),
        "data:image/png;base64,!!!not-base64",
        "data:image/png;base64," + base64.b64encode(b"plain text, not an image").decode(),
        "ftp://example.test/a.png",
        "data:image/png,rawnotbase64",
        "https://",
    ]
    response = await harness.submit(body(images=images))
    assert response.status_code == 400
    errors = fields(response)
    assert set(errors) == {"images[1]", "images[2]", "images[3]", "images[4]", "images[5]"}
    assert "accepted image format" in errors["images[2]"]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"])
async def test_accepted_formats_by_magic_bytes(harness: Harness, fmt: str) -> None:
    # The declared MIME type is wrong on purpose: the bytes decide.
    url = "data:application/octet-stream;base64," + base64.b64encode(image_bytes(fmt=fmt)).decode()
    assert (await harness.submit(body(images=[url]))).status_code == 200


async def test_heic_is_accepted(harness: Harness) -> None:
    import io

    import pillow_heif
    from PIL import Image

    pillow_heif.register_heif_opener()
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (0, 90, 200)).save(buffer, "HEIF")
    url = "data:image/heic;base64," + base64.b64encode(buffer.getvalue()).decode()
    assert (await harness.submit(body(images=[url]))).status_code == 200


async def test_image_urls_are_accepted_at_submit(harness: Harness) -> None:
    response = await harness.submit(body(images=["https://images.example.test/a.png", data_url()]))
    assert response.status_code == 200


async def test_unknown_model_and_wrong_path(harness: Harness) -> None:
    response = await harness.submit(body(model="nope/nothing"))
    assert response.status_code == 400
    assert "available models" in fields(response)["model"]
    response = await harness.submit(body(), path="generateAudio")
    assert response.status_code == 400
    message = fields(response)["model"]
    assert "/api/v1/model/generateImage" in message and "/api/v1/model/generateVideo" in message
    response = await harness.submit(body(model="test/fake-audio"), path="generateImage")
    assert "/api/v1/model/generateAudio" in fields(response)["model"]
    assert await task_count(harness) == 0


async def test_edit_model_on_video_path(harness: Harness) -> None:
    assert (await harness.submit(body(), path="generateVideo")).status_code == 200
    shipped = await harness.submit(body(model="genhook/image-edit"), path="generateVideo")
    assert shipped.status_code == 200


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (b"", "application/json"),
        (b"{", "application/json"),
        (b"[1,2]", "application/json"),
        (b"null", "application/json"),
        (b"\xff\xfe\x00", "application/json"),
        (b'{"model": "x"}', "text/plain"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json"),
    ],
)
async def test_malformed_bodies_are_400(harness: Harness, raw: bytes, content_type: str) -> None:
    response = await harness.client.post(
        "/api/v1/model/generateImage",
        content=raw,
        headers={**harness.headers, "Content-Type": content_type},
    )
    assert response.status_code == 400, response.text
    assert response.json()["errors"]


async def test_body_over_cap_is_413(harness: Harness) -> None:
    harness.state.settings.max_body_bytes = 10_000
    big = body(images=["data:image/png;base64," + "A" * 20_000])
    response = await harness.submit(big)
    assert response.status_code == 413
    assert "limit" in response.json()["message"]
    assert await task_count(harness) == 0


async def test_auth(harness: Harness) -> None:
    path = "/api/v1/model/generateImage"
    for headers in (
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer ghk_wrong"},
        {"Authorization": harness.headers["Authorization"] + "x"},
    ):
        response = await harness.client.post(path, json=body(), headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == 401
    assert await task_count(harness) == 0


async def test_revoked_key_and_second_key(harness: Harness) -> None:
    second = await create_key(harness.state.db, harness.account.account_id, "ci")
    headers = {"Authorization": f"Bearer {second.api_key}"}
    response = await harness.client.post(
        "/api/v1/model/generateImage", json=body(), headers=headers
    )
    assert response.status_code == 200
    await revoke_key(harness.state.db, second.key_id)
    # A verified key is cached for auth_cache_seconds; the revocation lands within that.
    deadline = time.monotonic() + harness.state.settings.auth_cache_seconds + 2
    while True:
        response = await harness.client.post(
            "/api/v1/model/generateImage", json=body(), headers=headers
        )
        if response.status_code == 401 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert response.status_code == 401
    assert (await harness.submit(body())).status_code == 200


async def test_foreign_and_unknown_tasks_are_404(harness: Harness) -> None:
    from genhook.accounts import create_account

    task_id = (await harness.submit(body())).json()["id"]
    other = await create_account(harness.state.db, "other")
    headers = {"Authorization": f"Bearer {other.api_key}"}
    foreign = await harness.client.get(f"/api/v1/model/result/{task_id}", headers=headers)
    unknown = await harness.client.get("/api/v1/model/result/" + "0" * 32, headers=headers)
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json()["message"].replace(task_id, "X") == unknown.json()["message"].replace(
        "0" * 32, "X"
    )
    long_id = await harness.client.get("/api/v1/model/result/" + "a" * 5000, headers=headers)
    assert long_id.status_code == 404


async def test_unknown_route_and_method_use_error_shape(harness: Harness) -> None:
    missing = await harness.client.get("/api/v1/nothing")
    assert missing.status_code == 404 and missing.json()["code"] == 404
    wrong = await harness.client.get("/api/v1/model/generateImage", headers=harness.headers)
    assert wrong.status_code == 405 and wrong.json()["code"] == 405


async def test_health_and_openapi(harness: Harness) -> None:
    assert (await harness.client.get("/healthz")).json() == {"status": "ok"}
    assert (await harness.client.get("/readyz")).json() == {"status": "ready"}
    spec = (await harness.client.get("/openapi.json")).json()
    for path in (
        "/api/v1/model/generateImage",
        "/api/v1/model/generateVideo",
        "/api/v1/model/generateAudio",
        "/api/v1/model/result/{request_id}",
        "/api/v1/usage",
    ):
        assert path in spec["paths"]
    submit = spec["paths"]["/api/v1/model/generateImage"]["post"]
    assert "400" in submit["responses"] and "401" in submit["responses"]
    # A union of the accepting models' request schemas, each with its fields.
    union = submit["requestBody"]["content"]["application/json"]["schema"]
    for member in union["oneOf"]:
        name = member["$ref"].rsplit("/", 1)[1]
        assert "images" in spec["components"]["schemas"][name]["properties"]
