"""The model catalogue and the per-model request schemas of the OpenAPI document, listing
whatever the registry holds (the test engines of ``GENHOOK_EXTRA_ENGINES`` included)."""

from __future__ import annotations

from typing import Any

from genhook.client import AsyncClient, ModelInfo, NotFound
from genhook.engines.base import ModelKind
from tests.conftest import Harness


async def catalogue(harness: Harness) -> dict[str, dict[str, Any]]:
    response = await harness.client.get("/api/v1/models", headers=harness.headers)
    assert response.status_code == 200, response.text
    return {model["id"]: model for model in response.json()["models"]}


async def test_catalogue_lists_every_registered_model(harness: Harness) -> None:
    models = await catalogue(harness)
    assert set(models) == {spec.id for spec in harness.state.registry}
    assert {"genhook/image-edit", "genhook/image-to-video", "test/fake-edit"} <= set(models)

    video = models["genhook/image-to-video"]
    assert video["kind"] == "video"
    assert video["submit_paths"] == ["/api/v1/model/generateVideo"]
    assert video["deadline_seconds"] == 600
    properties = video["request_schema"]["properties"]
    assert {"prompt", "images", "duration", "resolution", "aspect_ratio", "fps"} <= set(properties)
    assert properties["duration"]["maximum"] == 30
    assert video["pricing"]["unit"] == "second"
    assert video["pricing"]["prices_usd"] == {"480p": "0.010", "720p": "0.020", "1080p": "0.040"}
    assert "1080p" in video["pricing"]["summary"]

    edit = models["genhook/image-edit"]
    assert edit["submit_paths"] == ["/api/v1/model/generateImage", "/api/v1/model/generateVideo"]
    assert edit["pricing"]["prices_usd"]["2K"] == "0.030"
    assert "size" in edit["request_schema"]["properties"]

    # The audio models' prices are numbers in the catalogue, as the settings give them.
    tts, stt = models["genhook/text-to-speech"], models["genhook/speech-to-text"]
    assert tts["pricing"]["unit"] == "1000 characters"
    assert tts["pricing"]["prices_usd"] == {"per_1000_characters": "0.015"}
    assert "0.015 USD per started 1,000 characters" in tts["pricing"]["summary"]
    assert stt["pricing"]["unit"] == "task"
    assert stt["pricing"]["prices_usd"] == {"task": "0.006"}
    assert "0.006 USD per transcription" in stt["pricing"]["summary"]

    fake = models["test/fake-edit"]
    assert fake["pricing"]["summary"] and fake["pricing"]["prices_usd"] == {}


async def test_one_model_by_id_and_unknown_ones(harness: Harness) -> None:
    response = await harness.client.get(
        "/api/v1/models/genhook/image-to-video", headers=harness.headers
    )
    assert response.status_code == 200
    assert response.json()["id"] == "genhook/image-to-video"
    missing = await harness.client.get("/api/v1/models/nobody/nothing", headers=harness.headers)
    assert missing.status_code == 404
    assert missing.json()["code"] == 404 and "nobody/nothing" in missing.json()["message"]
    anonymous = await harness.client.get("/api/v1/models")
    assert anonymous.status_code == 401


async def test_sdk_models(harness: Harness) -> None:
    client = AsyncClient(
        harness.account.api_key, base_url="http://testserver", http_client=harness.client
    )
    models = await client.models()
    assert all(isinstance(model, ModelInfo) for model in models)
    video = await client.model("genhook/image-to-video")
    assert video.kind == "video" and "duration" in video.fields
    assert video.deadline_seconds == 600
    try:
        await client.model("nobody/nothing")
    except NotFound:
        pass
    else:  # pragma: no cover - the assertion below explains
        raise AssertionError("an unknown model must raise NotFound")


async def test_openapi_has_a_request_union_per_submit_path(harness: Harness) -> None:
    document = (await harness.client.get("/openapi.json")).json()
    components = document["components"]["schemas"]

    def request_schema(path: str) -> dict[str, Any]:
        post = document["paths"][f"/api/v1/model/{path}"]["post"]
        schema: dict[str, Any] = post["requestBody"]["content"]["application/json"]["schema"]
        return schema

    registry = harness.state.registry

    def accepted(kind: ModelKind) -> set[str]:
        return {spec.id for spec in registry if spec.accepts(kind)}

    video = request_schema("generateVideo")
    mapping = video["discriminator"]["mapping"]
    assert set(mapping) == accepted(ModelKind.VIDEO)
    assert {"genhook/image-edit", "genhook/image-to-video"} <= set(mapping)
    assert len(video["oneOf"]) == len(mapping)
    member = components[mapping["genhook/image-to-video"].rsplit("/", 1)[1]]
    assert member["properties"]["model"]["const"] == "genhook/image-to-video"
    assert "duration" in member["properties"]

    image = request_schema("generateImage")
    assert set(image["discriminator"]["mapping"]) == accepted(ModelKind.IMAGE)
    assert "genhook/image-to-video" not in image["discriminator"]["mapping"]
    models = document["paths"]["/api/v1/models"]["get"]
    assert "200" in models["responses"]
