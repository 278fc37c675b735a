"""Predictor models: the request schema read from ``predict``, its bounds, and the checks
of a ``GENHOOK_MODELS`` entry at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from genhook.config import Settings
from genhook.engines.edit_request import IMAGE_REFS
from genhook.engines.registry import Registry, build_registry
from genhook.tasks.submission import field_errors, stored_params
from tests.support.images import data_url

HERE = Path(__file__).resolve().parents[1] / "support" / "predictors"
POSTERIZE = {"id": "acme/posterize", "kind": "image", "predictor": f"{HERE}/posterize.py:Posterize"}
EVERY = {
    "id": "t/every",
    "kind": "image",
    "predictor": "tests.support.predictors.every_type:EveryType",
}
COG = {"id": "acme/gray", "kind": "image", "cog": str(HERE / "cog_gray")}


def registry(*entries: dict[str, Any]) -> Registry:
    return build_registry(Settings(models=list(entries)))


def schema_of(model: str, *entries: dict[str, Any]) -> type[BaseModel]:
    spec = registry(*entries).get(model)
    assert spec is not None
    return spec.request_schema


def errors(schema: type[BaseModel], body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        schema.model_validate(body, context={})
    return {error.field: error.message for error in field_errors(caught.value)}


def test_the_posterize_file_of_the_docs_is_a_model() -> None:
    spec = registry(POSTERIZE).get("acme/posterize")
    assert spec is not None
    assert spec.kind.value == "image"
    properties = spec.request_schema.model_json_schema()["properties"]
    assert properties["image"] == {
        "type": "string",
        "format": "uri",
        "contentMediaType": "image/*",
        "title": "Image",
    }
    assert properties["level"] == {
        "type": "integer",
        "default": 2,
        "minimum": 1,
        "maximum": 8,
        "description": "bits per channel",
        "title": "Level",
    }
    assert spec.request_schema.model_json_schema()["required"] == ["model", "image"]


def test_every_input_type_is_checked_and_named_in_errors() -> None:
    schema = schema_of("t/every", EVERY)
    picture = data_url((10, 20, 30))
    base = {"model": "t/every", "text": "hi"}
    assert errors(schema, {"model": "t/every"}) == {"text": "text is required"}
    bad = errors(
        schema,
        {
            **base,
            "text": "x" * 41,
            "count": 11,
            "scale": 1.5,
            "flag": "yes",
            "mode": "medium",
            "flavour": "sour",
            "image": "ftp://example.com/a.png",
            "pictures": [picture, "not a url"],
            "tags": ["a", "b", "c", "d", "e"],
            "document": "data:text/plain;base64,!!",
            "extra": 1,
        },
    )
    assert set(bad) == {
        "text",
        "count",
        "scale",
        "flag",
        "mode",
        "flavour",
        "image",
        "pictures[1]",
        "tags",
        "document",
        "extra",
    }, bad
    assert "11" in bad["count"] or "10" in bad["count"]
    assert errors(schema, {**base, "count": "3"}) == {"count": "count must be an integer"}
    assert errors(schema, {**base, "count": 2.5}) == {"count": "count must be an integer"}
    # An int is a float, a string is not.
    schema.model_validate({**base, "scale": 1}, context={})
    assert set(errors(schema, {**base, "scale": "0.5"})) == {"scale"}


def test_file_inputs_become_the_tasks_inputs_in_parameter_order() -> None:
    schema = schema_of("t/every", EVERY)
    picture = data_url((10, 20, 30))
    context: dict[str, Any] = {}
    request = schema.model_validate(
        {
            "model": "t/every",
            "text": "hi",
            "document": "data:text/csv;base64,YSxiCjEsMgo=",
            "pictures": [picture, "https://example.com/b.webp"],
            "image": picture,
        },
        context=context,
    )
    refs = context[IMAGE_REFS]
    assert [(r.field, r.format, r.url) for r in refs] == [
        ("image", "png", None),
        ("pictures[0]", "png", None),
        ("pictures[1]", None, "https://example.com/b.webp"),
        ("document", "csv", None),
    ]
    assert refs[3].content_type == "text/csv"
    assert bytes(refs[3].data or b"") == b"a,b\n1,2\n"
    # The task row keeps a note of each file, not its bytes.
    params = stored_params(request)
    assert params["image"] == "data:image/png"
    assert params["pictures"] == ["data:image/png", "https://example.com/b.webp"]
    assert params["document"] == "data:text/csv"
    assert len(json.dumps(params)) < 400


def test_a_cog_predictor_reads_its_inputs_like_cog() -> None:
    schema = schema_of("acme/gray", COG).model_json_schema()
    properties = schema["properties"]
    assert schema["required"] == ["model", "image"]
    assert properties["mode"]["enum"] == ["gray", "invert"]
    assert properties["mode"]["default"] == "gray"
    assert (properties["frames"]["minimum"], properties["frames"]["maximum"]) == (1, 5)
    assert properties["image"]["description"] == "a picture"
    assert properties["image"]["contentMediaType"] == "application/octet-stream"


def test_price_and_deadline_come_from_the_class_unless_the_entry_sets_them() -> None:
    spec = registry(EVERY).get("t/every")
    assert spec is not None
    assert spec.deadline_seconds == 120.0
    settings = Settings()
    request = spec.request_schema.model_validate({"model": "t/every", "text": "x"}, context={})
    assert str(spec.pricing(settings, request).total) == "0.002"
    spec = registry({**EVERY, "price_usd": "0.5", "deadline_seconds": 9}).get("t/every")
    assert spec is not None
    assert spec.deadline_seconds == 9.0
    assert str(spec.pricing(settings, request).total) == "0.5"
    assert spec.price_list is not None
    assert spec.price_list(settings)["prices_usd"] == {"task": "0.5"}


def write(tmp_path: Path, source: str) -> str:
    path = tmp_path / "model_file.py"
    path.write_text("from genhook.model import Input, Model, Output\n" + source)
    return f"{path}:M"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class M(Model):\n    def predict(self, x) -> str: ...\n", "'x' has no type annotation"),
        ("class M(Model):\n    def predict(self, x: dict) -> str: ...\n", "'x' has the type"),
        ("class M(Model):\n    def predict(self, model: str) -> str: ...\n", "clashes"),
        ("class M(Model):\n    def predict(self, *xs: str) -> str: ...\n", "*xs"),
        (
            "class M(Model):\n    def predict(self, x: str) -> bytes: ...\n",
            "without a content type",
        ),
        ("class M(Model):\n    pass\n", "has no predict method"),
        ("raise RuntimeError('boom')\n", "fails on import: RuntimeError: boom"),
        ("class N(Model):\n    pass\n", "defines no class 'M'"),
        (
            "from PIL import Image\nclass M(Model):\n"
            "    def predict(self, x: Image.Image = 3) -> str: ...\n",
            "a file input's default must be None",
        ),
    ],
)
def test_a_bad_predictor_stops_the_start_naming_the_entry(
    tmp_path: Path, source: str, expected: str
) -> None:
    entry = {"id": "acme/bad", "kind": "image", "predictor": write(tmp_path, source)}
    with pytest.raises(ValueError, match="entry 2 \\(acme/bad\\)") as caught:
        registry(POSTERIZE, entry)
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"id": "a/b", "kind": "image"}, "exactly one of"),
        ({"id": "a/b", "kind": "image", "predictor": "x.py:A", "cog": "/tmp"}, "exactly one of"),
        ({"id": "a/b", "kind": "image", "predictor": "nocolon"}, "must have the form"),
        ({"id": "a/b", "kind": "text", "predictor": "x:A"}, "kind"),
        ({"id": "a/b", "kind": "image", "predictor": "x:A", "device": "tpu"}, "device"),
        ({"id": "a/b", "kind": "image", "predictor": "x:A", "flavour": 1}, "flavour"),
        ({"id": "a/b", "kind": "image", "predictor": "/nowhere/x.py:A"}, "does not exist"),
        ({"id": "a/b", "kind": "image", "predictor": "no_such_module_x:A"}, "cannot be imported"),
        ({"id": "a/b", "kind": "image", "cog": "/nowhere"}, "cog.yaml"),
        ({**EVERY, "max_batch_size": 4}, "has no predict_batch"),
    ],
)
def test_a_bad_entry_stops_the_start_naming_it(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match="GENHOOK_MODELS entry 1") as caught:
        registry(entry)
    assert expected in str(caught.value)


def test_a_cog_project_without_a_predict_line_is_named(tmp_path: Path) -> None:
    (tmp_path / "cog.yaml").write_text("build:\n  gpu: false\n")
    with pytest.raises(ValueError, match="has no predict") as caught:
        registry({"id": "a/b", "kind": "image", "cog": str(tmp_path)})
    assert "GENHOOK_MODELS entry 1 (a/b)" in str(caught.value)


def test_models_file_entries_follow_the_inline_ones(tmp_path: Path) -> None:
    listed = tmp_path / "models.json"
    listed.write_text(json.dumps([COG]))
    models = build_registry(Settings(models=[POSTERIZE], models_file=listed))
    assert models.get("acme/posterize") is not None
    assert models.get("acme/gray") is not None
    listed.write_text("[")
    with pytest.raises(ValueError, match="GENHOOK_MODELS_FILE"):
        build_registry(Settings(models_file=listed))


def test_a_cog_text_stream_is_joined_and_logged(tmp_path: Path) -> None:
    pytest.importorskip("cog")
    from genhook.engines.base import EngineJob

    (tmp_path / "cog.yaml").write_text('predict: "predict.py:Predictor"\n')
    (tmp_path / "predict.py").write_text(
        "from cog import BasePredictor, ConcatenateIterator, Input, Secret\n"
        "class Predictor(BasePredictor):\n"
        "    def predict(self, prompt: str = Input(description='words'),\n"
        "                key: Secret = Input(default='s3cret')) -> ConcatenateIterator[str]:\n"
        "        for word in prompt.split():\n"
        "            yield word + ' '\n"
        "        yield key.get_secret_value()\n"
    )
    spec = registry({"id": "acme/words", "kind": "audio", "cog": str(tmp_path)}).get("acme/words")
    assert spec is not None
    request = spec.request_schema.model_validate({"model": "acme/words", "prompt": "a b"})
    engine = spec.engine_factory(Settings())
    engine.load()
    logged: list[str] = []
    job = EngineJob(
        task_id="t",
        model="acme/words",
        params=stored_params(request),
        images=[],
        report=lambda progress=None, log=None: logged.append(log),
        request=request,
    )
    result = engine.run(job)
    assert result.outputs == []
    assert result.info == {"output": "a b s3cret"}
    assert logged == ["a ", "b ", "s3cret"]
