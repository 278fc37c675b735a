"""``genhook predict``: one call of any configured model in this process, the request
checked as a submit checks it, the outputs written to a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageOps
from typer.testing import CliRunner

from genhook.cli import app
from genhook.cli.predict_cmd import request_fields
from tests.conftest import ROOT
from tests.support.images import image_bytes

HERE = Path(__file__).resolve().parents[1] / "support" / "predictors"
POSTERIZE = {"id": "acme/posterize", "kind": "image", "predictor": f"{HERE}/posterize.py:Posterize"}
COG = {"id": "acme/gray", "kind": "image", "cog": str(HERE / "cog_gray")}


def predict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str, **env: Any
) -> tuple[int, str, dict[str, Any] | None]:
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(tmp_path / "data"))
    for name, value in env.items():
        monkeypatch.setenv(name, value if isinstance(value, str) else json.dumps(value))
    result = CliRunner().invoke(app, ["predict", *args])
    output = result.stdout
    try:
        summary = json.loads(output)
    except ValueError:
        summary = None
    return result.exit_code, output + result.stderr, summary


def test_typed_fields_from_the_schema(tmp_path: Path) -> None:
    schema = {
        "properties": {
            "n": {"type": "integer"},
            "x": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "on": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "name": {"type": "string"},
        }
    }
    file = tmp_path / "a.png"
    file.write_bytes(image_bytes())
    fields = request_fields(
        ["n=3", "x=0.5", "on=true", "tags=a", "tags=7", "name=12", f"pic=@{file}", "other=[1]"],
        schema,
    )
    assert fields["n"] == 3 and fields["x"] == 0.5 and fields["on"] is True
    assert fields["tags"] == ["a", "7"] and fields["name"] == "12"
    assert fields["pic"].startswith("data:image/png;base64,")
    assert fields["other"] == [1]
    with pytest.raises(ValueError, match="given twice"):
        request_fields(["n=1", "n=2"], schema)
    with pytest.raises(ValueError, match="expected name=value"):
        request_fields(["n"], schema)
    with pytest.raises(ValueError, match="No such file"):
        request_fields(["pic=@/nowhere/x.png"], schema)


def test_a_predictor_model_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    picture = tmp_path / "in.png"
    picture.write_bytes(image_bytes((200, 30, 30), "PNG", 12))
    out = tmp_path / "out"
    code, text, summary = predict(
        monkeypatch,
        tmp_path,
        "acme/posterize",
        "-i",
        f"image=@{picture}",
        "-i",
        "level=1",
        "-o",
        str(out),
        GENHOOK_MODELS=[POSTERIZE],
    )
    assert code == 0, text
    assert summary is not None
    assert summary["outputs"] == [str(out / "output-0.png")]
    expected = ImageOps.posterize(ImageOps.invert(Image.open(picture).convert("RGB")), 1)
    assert Image.open(out / "output-0.png").convert("RGB").tobytes() == expected.tobytes()
    # A bad value is refused as a submit refuses it, naming the field.
    code, text, _ = predict(
        monkeypatch, tmp_path, "acme/posterize", "-i", f"image=@{picture}", "-i", "level=9"
    )
    assert code == 1
    assert "level: level must be at most 8" in text


def test_a_cog_model_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("cog")
    picture = tmp_path / "in.png"
    picture.write_bytes(image_bytes((200, 30, 30), "PNG", 12))
    code, text, summary = predict(
        monkeypatch,
        tmp_path,
        "acme/gray",
        "-i",
        f"image=@{picture}",
        "-i",
        "frames=2",
        "-o",
        str(tmp_path / "gray"),
        GENHOOK_MODELS=[COG],
    )
    assert code == 0, text
    assert summary is not None
    assert [Path(p).name for p in summary["outputs"]] == ["output-0.png", "output-1.png"]
    assert Image.open(tmp_path / "gray" / "output-1.png").size == (5, 5)


def test_a_built_in_model_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    picture = tmp_path / "in.png"
    picture.write_bytes(image_bytes((200, 30, 30), "PNG", 40))
    code, text, summary = predict(
        monkeypatch,
        tmp_path,
        "genhook/image-edit",
        "-i",
        f"images=@{picture}",
        "-i",
        "prompt=make it grayscale",
        "-i",
        "size=1024*1024",
        "-i",
        "output_format=png",
        "-o",
        str(tmp_path / "edit"),
    )
    assert code == 0, text
    assert summary is not None
    assert summary["info"]["summary"] == "grayscale"
    result = Image.open(tmp_path / "edit" / "output-0.png")
    assert result.size == (1024, 1024)
    code, text, _ = predict(monkeypatch, tmp_path, "nobody/nothing", "-i", "prompt=x")
    assert code == 1
    assert "unknown model 'nobody/nothing'" in text


@pytest.mark.timeout(600)
def test_a_local_weight_model_once(tmp_path: Path) -> None:
    """In a process of its own: the command starts the worker's model process, which ends
    with it."""
    pytest.importorskip("diffusers")
    from tests.support.tiny_pipelines import build

    pipeline = "StableDiffusionXLPipeline"
    weights = build(pipeline, tmp_path / "sdxl")
    entry = {
        "id": "local/sdxl",
        "kind": "image",
        "pipeline": pipeline,
        "path": str(weights),
        "device": "cpu",
        "dtype": "float32",
        "steps": 2,
        "generate_size": "32*32",
        "sizes": ["1024*1024"],
    }
    env = {
        **os.environ,
        "GENHOOK_LOCAL_MODELS": json.dumps([entry]),
        "GENHOOK_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    args = ["-i", "prompt=a red square", "-i", "size=1024*1024", "-i", "seed=3"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "genhook.cli",
            "predict",
            "local/sdxl",
            *args,
            "-o",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert Image.open(summary["outputs"][0]).size == (1024, 1024)
    assert summary["info"]["seed"] == 3
