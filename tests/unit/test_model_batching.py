"""``GENHOOK_MODEL_BATCHING`` sets a registered model's batch size, wait and concurrency;
an unknown model or an out-of-range value fails the start with a clear message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from genhook.config import Settings
from genhook.engines.audio import STT_MODEL_ID
from genhook.engines.registry import build_registry


def test_the_setting_applies_to_a_built_in_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "GENHOOK_MODEL_BATCHING",
        f'{{"{STT_MODEL_ID}": {{"max_batch_size": 8, "max_wait_ms": 20}}}}',
    )
    registry = build_registry(Settings())
    spec = registry.get(STT_MODEL_ID)
    assert spec is not None
    assert (spec.max_batch_size, spec.max_wait_ms, spec.concurrency) == (8, 20, 1)
    assert all(other.max_batch_size == 1 for other in registry if other.id != STT_MODEL_ID)


def test_an_unknown_model_fails_the_start() -> None:
    settings = Settings(model_batching={"no/such-model": {"max_batch_size": 4}})
    with pytest.raises(ValueError, match="unknown model 'no/such-model'"):
        build_registry(settings)


@pytest.mark.parametrize(
    "entry",
    [{"max_batch_size": 0}, {"max_wait_ms": -1}, {"concurrency": 0}, {"batch": 4}],
)
def test_values_out_of_range_are_refused(entry: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Settings(model_batching={STT_MODEL_ID: entry})
