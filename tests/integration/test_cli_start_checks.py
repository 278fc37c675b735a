"""A role command whose settings name a model badly (or hold a value that does not parse)
stops before it starts anything: one line naming the setting, exit status 1, no traceback,
nothing written to the data directory (``genhook serve`` used to migrate, start its children,
and let each fail with a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

BAD = {
    "preload": (
        {"GENHOOK_PRELOAD_MODELS": '["no/such"]'},
        "GENHOOK_PRELOAD_MODELS (--preload): unknown model 'no/such'",
    ),
    "local model": (
        {
            "GENHOOK_LOCAL_MODELS": json.dumps(
                [
                    {
                        "id": "local/gone",
                        "kind": "image",
                        "pipeline": "StableDiffusionInstructPix2PixPipeline",
                        "path": "/nonexistent/weights",
                    }
                ]
            )
        },
        "local model entry 1 (local/gone): /nonexistent/weights/model_index.json does not exist",
    ),
    "models file": (
        {"GENHOOK_LOCAL_MODELS_FILE": "/nonexistent/models.json"},
        "GENHOOK_LOCAL_MODELS_FILE: /nonexistent/models.json: No such file or directory",
    ),
    "setting": (
        {"GENHOOK_UPSTREAM_MODELS": '[{"id": 1'},
        "GENHOOK_UPSTREAM_MODELS is not valid JSON: Expecting ',' delimiter",
    ),
    "batching": (
        {"GENHOOK_MODEL_BATCHING": '{"no/such": {"max_batch_size": 2}}'},
        "GENHOOK_MODEL_BATCHING: unknown model 'no/such'",
    ),
}


@pytest.mark.parametrize("role", ["serve", "api", "worker", "dispatcher"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_model_setting_stops_the_role_before_it_starts(
    tmp_path: Path, role: str, case: str
) -> None:
    variables, message = BAD[case]
    data = tmp_path / "data"
    data.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "genhook.cli", role],
        env={
            **os.environ,
            "PYTHONPATH": str(SRC),
            "GENHOOK_DATA_DIR": str(data),
            "COLUMNS": "400",  # the error on one line
            **variables,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"error: {message}" in output, output
    assert "Traceback" not in output, output
    assert list(data.iterdir()) == []
