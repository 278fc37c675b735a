"""Models named by the settings that no entry registers fail the start, naming the setting."""

from __future__ import annotations

import pytest

from genhook.config import Settings
from genhook.engines.registry import IMAGE_EDIT_MODEL_ID as MODEL_ID
from genhook.engines.registry import build_registry


def test_an_unknown_preload_fails_the_start() -> None:
    message = r"GENHOOK_PRELOAD_MODELS \(--preload\): unknown model 'no/such'"
    with pytest.raises(ValueError, match=message):
        build_registry(Settings(preload_models=[MODEL_ID, "no/such"]))


def test_a_known_preload_is_accepted() -> None:
    assert build_registry(Settings(preload_models=[MODEL_ID])).get(MODEL_ID) is not None
