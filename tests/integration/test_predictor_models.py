"""Predictor models through the service: submit, the worker's call, outputs, progress,
cancel, batching, and a Cog predictor, on the in-process API and worker."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http.server
import io
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageOps

from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url, image_bytes

pytest.importorskip("cog")

HERE = Path(__file__).resolve().parents[1] / "support" / "predictors"
MODULE = "tests.support.predictors.every_type"
ENTRIES: list[dict[str, Any]] = [
    {"id": "acme/posterize", "kind": "image", "predictor": f"{HERE}/posterize.py:Posterize"},
    {"id": "t/every", "kind": "image", "predictor": f"{MODULE}:EveryType"},
    {"id": "t/speak", "kind": "audio", "predictor": f"{MODULE}:Speak"},
    {"id": "t/numbers", "kind": "image", "predictor": f"{MODULE}:Numbers"},
    {"id": "t/broken", "kind": "image", "predictor": f"{MODULE}:Broken"},
    {
        "id": "t/doubler",
        "kind": "image",
        "predictor": f"{MODULE}:Doubler",
        "max_batch_size": 4,
        "max_wait_ms": 50,
    },
    {"id": "acme/gray", "kind": "image", "cog": str(HERE / "cog_gray")},
]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    settings = make_settings(
        tmp_path,
        f"sqlite+aiosqlite:///{tmp_path / 'genhook.db'}",
        models=ENTRIES,
        progress_interval_seconds=0.01,
        cancel_check_seconds=0.05,
    )
    harness = await make_harness(settings)
    yield harness
    await harness.client.aclose()
    await harness.state.db.dispose()


async def submit(h: Harness, body: dict[str, Any], path: str = "generateImage") -> str:
    response = await h.submit(body, path)
    assert response.status_code == 200, response.text
    task_id: str = response.json()["id"]
    return task_id


async def finished(h: Harness, task_id: str) -> dict[str, Any]:
    await h.run_all()
    response = await h.client.get(f"/api/v1/model/result/{task_id}?logs=1", headers=h.headers)
    data: dict[str, Any] = response.json()
    return data


async def output_bytes(h: Harness, url: str) -> bytes:
    response = await h.client.get(url, headers=h.headers)
    assert response.status_code == 200, response.text
    return response.content


@contextlib.contextmanager
def file_server(files: dict[str, bytes]) -> Iterator[str]:
    """A loopback HTTP server of ``files``, stopped on exit."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = files.get(self.path)
            self.send_response(200 if data is not None else 404)
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_posterize_end_to_end_and_in_the_catalogue(h: Harness) -> None:
    picture = image_bytes((200, 30, 30), "PNG", 16)
    task_id = await submit(
        h, {"model": "acme/posterize", "image": data_url((200, 30, 30), size=16), "level": 1}
    )
    result = await finished(h, task_id)
    assert result["status"] == "completed", result
    (url,) = result["outputs"]
    out = Image.open(io.BytesIO(await output_bytes(h, url)))
    expected = ImageOps.posterize(
        ImageOps.invert(Image.open(io.BytesIO(picture)).convert("RGB")), 1
    )
    assert out.format == "PNG"
    assert out.convert("RGB").tobytes() == expected.tobytes()
    engine: Any = await h.worker.load_engine("acme/posterize")
    assert engine.instance.calls == 1
    # A bad value is a 400 naming the field; nothing runs.
    bad = await h.submit({"model": "acme/posterize", "image": data_url(), "level": 9})
    assert bad.status_code == 400
    assert [e["field"] for e in bad.json()["errors"]] == ["level"]
    missing = await h.submit({"model": "acme/posterize", "level": 2})
    assert [e["field"] for e in missing.json()["errors"]] == ["image"]
    # The catalogue lists it with the schema read from predict.
    catalogue = await h.client.get("/api/v1/models", headers=h.headers)
    listed = {m["id"]: m for m in catalogue.json()["models"]}["acme/posterize"]
    assert listed["request_schema"]["properties"]["level"]["maximum"] == 8
    assert listed["pricing"]["prices_usd"] == {"task": "0"}
    # OpenAPI's generateImage request union has it, with the same fields.
    document = (await h.client.get("/openapi.json")).json()
    post = document["paths"]["/api/v1/model/generateImage"]["post"]
    mapping = post["requestBody"]["content"]["application/json"]["schema"]["discriminator"]
    component = mapping["mapping"]["acme/posterize"].rsplit("/", 1)[-1]
    described = document["components"]["schemas"][component]["properties"]
    assert described["level"]["maximum"] == 8
    assert described["image"]["contentMediaType"] == "image/*"
    # The console's form offers the picture as a file and the level as a slider.
    from genhook.console.routes import form_fields

    controls = {f["name"]: f for f in form_fields(listed["request_schema"])}
    assert controls["image"]["control"] == "file"
    assert controls["image"]["accept"] == "image/*"
    assert (controls["level"]["control"], controls["level"]["max"]) == ("range", 8)


async def test_every_input_and_output_type(h: Harness) -> None:
    document = b"col\n1\n2\n"
    fetched = image_bytes((0, 0, 250), "JPEG", 24)
    with file_server({"/blue.jpg": fetched, "/doc.csv": document}) as base:
        task_id = await submit(
            h,
            {
                "model": "t/every",
                "text": "hi",
                "count": 2,
                "scale": 1,
                "flag": True,
                "mode": "slow",
                "flavour": "spicy",
                "image": data_url((10, 200, 10), size=20),
                "pictures": [f"{base}/blue.jpg", data_url(size=12)],
                "document": f"{base}/doc.csv",
                "tags": ["a", "b"],
            },
        )
        result = await finished(h, task_id)
    assert result["status"] == "completed", result
    info = result["info"]
    assert info["text"] == "hi"
    assert (info["count"], info["scale"], info["flag"]) == (2, 1.0, True)
    assert (info["mode"], info["flavour"], info["tags"]) == ("slow", "spicy", ["a", "b"])
    assert info["image"] == [20, 20, "RGB"]
    assert info["pictures"] == [[24, 24], [12, 12]]
    assert info["document"] == {
        "suffix": ".csv",
        "sha256": hashlib.sha256(document).hexdigest(),
    }
    assert info["output"] == "hi x2"
    picture_url, copy_url = result["outputs"]
    assert Image.open(io.BytesIO(await output_bytes(h, picture_url))).size == (8, 8)
    assert await output_bytes(h, copy_url) == document
    assert copy_url.endswith(".csv")


async def test_a_fetch_failure_names_the_field(h: Harness) -> None:
    with file_server({}) as base:
        task_id = await submit(
            h, {"model": "t/every", "text": "x", "pictures": [data_url(), f"{base}/gone.png"]}
        )
        result = await finished(h, task_id)
    assert result["status"] == "failed"
    assert result["error"].startswith("pictures[1]: "), result["error"]


async def test_a_picture_that_does_not_decode_fails_naming_the_field(h: Harness) -> None:
    with file_server({"/fake.png": b"not a picture at all"}) as base:
        task_id = await submit(h, {"model": "t/every", "text": "x", "image": f"{base}/fake.png"})
        result = await finished(h, task_id)
    assert result["status"] == "failed"
    assert result["error"].startswith("image: image 1 is not one of"), result


async def test_pixel_budget_names_the_picture_field(h: Harness) -> None:
    from tests.integration.test_pixel_budget import webp_url

    big = webp_url(6000, 6000)
    response = await h.submit({"model": "t/every", "text": "x", "pictures": [big, big, big]})
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "pictures"


async def test_bytes_of_a_declared_type_and_a_predictor_error(h: Harness) -> None:
    task_id = await submit(h, {"model": "t/speak", "text": "abc"}, "generateAudio")
    result = await finished(h, task_id)
    assert result["status"] == "completed", result
    (url,) = result["outputs"]
    assert url.endswith(".txt")
    assert await output_bytes(h, url) == b"cba"
    task_id = await submit(h, {"model": "t/broken", "value": 7})
    result = await finished(h, task_id)
    assert result["status"] == "failed"
    assert result["error"] == "predict failed: RuntimeError: cannot handle 7"


async def test_progress_is_reported_and_cancel_stops_the_call(h: Harness) -> None:
    task_id = await submit(h, {"model": "t/numbers", "steps": 3})
    result = await finished(h, task_id)
    assert result["status"] == "completed", result
    assert result["info"] == {"steps": 3}
    logs = [event["message"] for event in result.get("logs", [])]
    assert [line for line in logs if "/3" in line] == ["step 1/3", "step 2/3", "step 3/3"]

    engine: Any = await h.worker.load_engine("t/numbers")
    engine.instance.release.clear()
    engine.instance.started.clear()
    stop = asyncio.Event()
    running = asyncio.create_task(h.worker.run(stop))
    try:
        task_id = await submit(h, {"model": "t/numbers", "steps": 1000})
        assert await asyncio.to_thread(engine.instance.started.wait, 30)
        canceled = await h.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=h.headers)
        assert canceled.status_code == 200, canceled.text
        for _ in range(600):  # the worker sees the cancel and sets the job's stop
            if not h.worker._engine_tasks:
                break
            engine.instance.release.set()  # the next step reports, and is told to stop
            await asyncio.sleep(0.05)
        assert not h.worker._engine_tasks, "the call went on after the cancel"
    finally:
        engine.instance.release.set()
        stop.set()
        await running
    assert (await h.result(task_id))["status"] == "canceled"
    assert engine.instance.stopped  # progress() raised Stopped inside predict


async def test_batched_calls_and_an_item_that_fails_alone(h: Harness) -> None:
    ids = [await submit(h, {"model": "t/doubler", "value": v}) for v in (1, -1, 3)]
    results = [await finished(h, task_id) for task_id in ids]
    engine: Any = await h.worker.load_engine("t/doubler")
    assert engine.instance.calls == [3]
    assert results[0]["info"]["double"] == 2
    assert results[2]["info"]["double"] == 6
    assert results[0]["info"]["batch"] == results[2]["info"]["batch"] == 3
    assert results[1]["status"] == "failed"
    assert results[1]["error"] == "predict failed: ValueError: negative"


async def test_a_cog_predictor_runs_unchanged(h: Harness) -> None:
    notes = "data:text/plain;base64," + base64.b64encode(b"hello notes").decode()
    task_id = await submit(
        h,
        {
            "model": "acme/gray",
            "image": data_url((250, 10, 10), size=16),
            "frames": 3,
            "notes": notes,
        },
    )
    result = await finished(h, task_id)
    assert result["status"] == "completed", result
    assert len(result["outputs"]) == 3
    sizes = []
    for url in result["outputs"]:
        picture = Image.open(io.BytesIO(await output_bytes(h, url)))
        sizes.append(picture.size)
        assert picture.mode == "L"
    assert sizes == [(4, 4), (5, 5), (6, 6)]
    logs = [event["message"] for event in result.get("logs", [])]
    assert {"output 1", "output 2", "output 3"} <= set(logs), result
    bad = await h.submit({"model": "acme/gray", "image": data_url(), "mode": "sepia"})
    assert bad.status_code == 400
    assert [e["field"] for e in bad.json()["errors"]] == ["mode"]
    bad = await h.submit({"model": "acme/gray", "image": data_url(), "frames": 6})
    assert [e["field"] for e in bad.json()["errors"]] == ["frames"]
