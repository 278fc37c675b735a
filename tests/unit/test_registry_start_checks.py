"""Models named by the settings that no entry registers fail the start, naming the setting."""

from __future__ import annotations

import pytest

from genhook.config import Settings
from genhook.engines.registry import IMAGE_EDIT_MODEL_ID as MODEL_ID
from genhook.engines.registry import build_registry, claimable_models


def test_an_unknown_preload_fails_the_start() -> None:
    message = r"GENHOOK_PRELOAD_MODELS \(--preload\): unknown model 'no/such'"
    with pytest.raises(ValueError, match=message):
        build_registry(Settings(preload_models=[MODEL_ID, "no/such"]))


def test_a_known_preload_is_accepted() -> None:
    assert build_registry(Settings(preload_models=[MODEL_ID])).get(MODEL_ID) is not None


def test_an_unknown_worker_model_fails_the_start() -> None:
    message = r"GENHOOK_WORKER_MODELS \(--model\): unknown model 'no/such'"
    with pytest.raises(ValueError, match=message):
        build_registry(Settings(worker_models=[MODEL_ID, "no/such"]))


def test_a_worker_claims_only_its_model_group() -> None:
    settings = Settings(worker_models=[MODEL_ID])
    registry = build_registry(settings)
    assert claimable_models(registry, settings) == [MODEL_ID]
    everything = Settings()
    all_models = claimable_models(build_registry(everything), everything)
    assert MODEL_ID in all_models and len(all_models) > 1
