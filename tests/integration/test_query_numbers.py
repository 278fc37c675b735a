"""Numbers outside the body (query parameters, cursors, headers) that no column can hold or
the interpreter refuses to parse: each is a 400 naming its field, never a 500."""

from __future__ import annotations

import base64

from tests.conftest import Harness
from tests.support.images import data_url

HUGE = "9" * 30
ENORMOUS = "9" * 5000


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


PROBES = [
    ("/api/v1/model/results", {"since": HUGE}, {}, "since"),
    ("/api/v1/model/results", {"since": ENORMOUS}, {}, "since"),
    ("/api/v1/model/results", {"since": "²"}, {}, "since"),
    ("/api/v1/model/results", {"limit": ENORMOUS}, {}, "limit"),
    ("/api/v1/model/results", {"cursor": cursor_of(HUGE + ".task_x")}, {}, "cursor"),
    ("/api/v1/model/results", {"cursor": cursor_of(ENORMOUS + ".task_x")}, {}, "cursor"),
    ("/api/v1/webhooks/deliveries", {"before": HUGE + ":dlv_x"}, {}, "before"),
    ("/api/v1/webhooks/deliveries", {"before": ENORMOUS + ":dlv_x"}, {}, "before"),
    ("/api/v1/webhooks/deliveries", {"limit": ENORMOUS}, {}, "limit"),
    ("/api/v1/usage", {"cursor": ENORMOUS}, {}, "cursor"),
    ("/api/v1/usage", {"limit": ENORMOUS}, {}, "limit"),
    ("{task}/events", {}, {"Last-Event-ID": "completed:" + ENORMOUS}, "Last-Event-ID"),
    ("{task}/events", {}, {"Last-Event-ID": "completed:" + HUGE}, "Last-Event-ID"),
    ("{task}", {}, {"Prefer": "wait=²".encode()}, "Prefer"),
]


async def test_an_oversized_number_is_a_400_naming_its_field(harness: Harness) -> None:
    submitted = await harness.submit(
        {"model": "test/fake-edit", "prompt": "x", "images": [data_url()]}
    )
    task = f"/api/v1/model/result/{submitted.json()['id']}"
    answers = []
    for path, params, headers, field in PROBES:
        response = await harness.client.get(
            path.replace("{task}", task), params=params, headers={**harness.headers, **headers}
        )
        named = response.json()["errors"][0]["field"] if response.status_code == 400 else None
        answers.append((path, field, response.status_code, named))
    assert answers == [(path, field, 400, field) for path, _, _, field in PROBES]


async def test_a_huge_byte_range_is_ignored_not_a_500(harness: Harness) -> None:
    submitted = await harness.submit(
        {"model": "test/fake-edit", "prompt": "x", "images": [data_url()]}
    )
    assert await harness.run_all() == 1
    result = await harness.result(submitted.json()["id"])
    url = result["outputs"][0].removeprefix("http://testserver")
    ranges = (f"bytes={ENORMOUS}-", f"bytes=-{ENORMOUS}", f"bytes=0-{ENORMOUS}")
    ranges += ("bytes=²-".encode(),)
    for header in ranges:
        response = await harness.client.get(url, headers={**harness.headers, "Range": header})
        assert response.status_code in (200, 206, 416), (header, response.text)
