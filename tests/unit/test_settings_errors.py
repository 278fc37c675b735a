"""A bad ``GENHOOK_*`` value is reported by its variable's name, each problem where it is."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from genhook.cli._environment import describe
from genhook.config import Settings


def test_a_value_out_of_range_and_a_bad_entry_name_their_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENHOOK_NSFW_THRESHOLD", "2")
    monkeypatch.setenv("GENHOOK_LOCAL_MODELS", '[{"id": "a"}, "b"]')
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert describe(caught.value) == (
        "GENHOOK_NSFW_THRESHOLD: Input should be less than or equal to 1; "
        "GENHOOK_LOCAL_MODELS[1]: Input should be a valid dictionary"
    )


def test_a_value_that_is_not_json_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENHOOK_PRELOAD_MODELS", "local/sdxl")
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert describe(caught.value).startswith("GENHOOK_PRELOAD_MODELS is not valid JSON: ")
