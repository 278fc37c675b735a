"""No request can produce a 500: property-based requests against the running service.

Schemathesis derives requests (valid and invalid) from our own OpenAPI document; a
Hypothesis strategy throws arbitrary JSON at the submit endpoint. Every answer must be
below 500 and every error must have the documented shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.leftovers import temporary_directory


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    live = start_service(tmp_path_factory.mktemp("fuzz"), GENHOOK_WORKERS="0")
    yield live
    stop_service(live)


def _openapi_document() -> dict[str, Any]:
    """The service's own OpenAPI document; building the app opens no connection."""
    from genhook.api import build_state, create_app
    from genhook.config import Settings

    data_dir = temporary_directory("genhook-openapi-")
    state = build_state(Settings(data_dir=data_dir))
    document: dict[str, Any] = create_app(state).openapi()
    return document


schema = schemathesis.openapi.from_dict(_openapi_document())


def assert_error_shape(response: Any) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        assert body["code"] == response.status_code
        assert isinstance(body["message"], str) and body["message"]
        assert all(set(e) == {"field", "message"} for e in body["errors"])


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests(case: Any, service: LiveService) -> None:
    for headers in ({"Authorization": f"Bearer {service.api_key}"}, {}):
        response = case.call(base_url=service.base_url, headers=headers)
        assert_error_shape(response)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "model",
        "prompt",
        "images",
        "size",
        "output_format",
        "thinking",
        "prompt_optimization_mode",
        "enable_base64_output",
        "webhook_url",
    ]
)
valid_like = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["genhook/image-edit", "test/fake-edit", "x"]) | json_values,
        "prompt": st.text(max_size=50) | json_values,
        "images": st.lists(
            st.sampled_from([data_url(), "https://img.example.test/a.png", "data:,"])
            | st.text(max_size=40),
            max_size=12,
        )
        | json_values,
    },
    optional={
        "size": st.sampled_from(["2048*2048", "1*1", "99999*99999", "a*b"]) | json_values,
        "output_format": st.sampled_from(["jpeg", "png", "tiff"]) | json_values,
        "webhook_url": st.sampled_from(
            ["https://127.0.0.1/x", "http://hooks.example.test/", "https://" + "a" * 2000]
        )
        | json_values,
    },
)


@given(
    body=st.one_of(valid_like, st.dictionaries(fields, json_values), json_values),
    path=st.sampled_from(["generateImage", "generateVideo", "generateAudio"]),
)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_arbitrary_json_bodies(service: LiveService, body: Any, path: str) -> None:
    response = HTTP.post(
        f"{service.base_url}/api/v1/model/{path}",
        content=json.dumps(body),
        headers={"Authorization": f"Bearer {service.api_key}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert_error_shape(response)
    assert response.status_code in (200, 400), response.text


def test_service_log_has_no_tracebacks(service: LiveService) -> None:
    assert "Traceback" not in Path(service.log_path).read_text(errors="replace")
