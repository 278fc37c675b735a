"""``thinking`` and ``prompt_optimization_mode`` have real, observable effects."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from genhook.engines.image_edit import ImageEditEngine
from genhook.errors import ErrorCode, TaskFailure
from tests.unit.image_edit_fixtures import encode, gradient, make_engine, noise, run


@pytest.fixture(scope="module")
def engine() -> Iterator[ImageEditEngine]:
    yield make_engine()


def test_thinking_disabled_reads_only_the_strict_vocabulary(engine: ImageEditEngine) -> None:
    source = encode(gradient())
    with pytest.raises(TaskFailure) as info:
        run(engine, "give it a vintage feel", [source], thinking="disabled")
    assert info.value.code == ErrorCode.PROMPT_NOT_UNDERSTOOD
    out, result = run(engine, "give it a vintage feel", [source], thinking="enabled")
    assert [step["op"] for step in result.info["plan"]] == ["sepia"]
    assert result.info["interpretations"] == [{"read": "vintage", "as": "sepia"}]
    a = np.asarray(out.convert("RGB"), dtype=np.int32)
    assert (a[:, :, 0] >= a[:, :, 2]).mean() > 0.99


def test_thinking_enabled_corrects_typos_and_reports_them(engine: ImageEditEngine) -> None:
    _, result = run(engine, "rotaet 90 degres", [encode(gradient())], thinking="enabled")
    assert result.info["plan"][0]["op"] == "rotate"
    assert {"read": "rotaet", "as": "rotate"} in result.info["interpretations"]


def test_fast_mode_trades_quality_for_speed_visibly(engine: ImageEditEngine) -> None:
    source = encode(noise((512, 512)))
    standard, r1 = run(engine, "sharpen", [source], output_format="jpeg", size="2048*2048")
    fast, r2 = run(
        engine,
        "sharpen",
        [source],
        output_format="jpeg",
        size="2048*2048",
        prompt_optimization_mode="fast",
    )
    assert standard.size == fast.size == (2048, 2048)
    assert r1.info["resampling"] != r2.info["resampling"] == "bilinear"
    assert r2.info["prompt_optimization_mode"] == "fast"
    # Fast encodes at a lower JPEG quality, so the same picture takes fewer bytes.
    assert len(r2.outputs[0].data) < len(r1.outputs[0].data)
    diff = np.abs(np.asarray(standard, np.int32) - np.asarray(fast, np.int32)).mean()
    assert diff > 1.0
