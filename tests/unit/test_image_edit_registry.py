"""The registry builds this engine for ``genhook/image-edit`` and a job runs through it."""

from __future__ import annotations

import io

from PIL import Image

from genhook.config import Settings
from genhook.engines.base import EngineJob
from genhook.engines.edit_request import EditRequest
from genhook.engines.image_edit import ImageEditEngine
from genhook.engines.registry import IMAGE_EDIT_MODEL_ID, build_registry
from tests.unit.image_edit_fixtures import encode, quadrants


def test_registry_builds_the_engine_and_a_validated_request_runs() -> None:
    settings = Settings()
    spec = build_registry(settings).get(IMAGE_EDIT_MODEL_ID)
    assert spec is not None
    engine = spec.engine_factory(settings)
    assert isinstance(engine, ImageEditEngine)
    engine.load()
    engine.load()  # idempotent: a worker may call it again after a restart of its loop

    request = EditRequest.model_validate(
        {
            "model": IMAGE_EDIT_MODEL_ID,
            "prompt": "flip horizontally",
            "images": ["https://example.invalid/a.png"],
            "size": "1536*1536",
            "output_format": "png",
        }
    )
    # What the service passes: every validated field but ``images`` and ``webhook_url``.
    params = request.model_dump(exclude={"images", "webhook_url"})
    result = engine.run(EngineJob("t1", IMAGE_EDIT_MODEL_ID, params, [encode(quadrants())]))
    (output,) = result.outputs
    picture = Image.open(io.BytesIO(output.data))
    assert picture.size == (1536, 1536) and picture.format == "PNG"
    assert output.content_type == "image/png" and output.nsfw is False
    assert result.info["plan"] == [
        {"op": "flip", "axis": "horizontal", "from": "flip horizontally"}
    ]
    # Flipped: the green top-right quadrant is now top left.
    r, g, _ = picture.convert("RGB").getpixel((300, 300))[:3]
    assert g > 150 and r < 80
