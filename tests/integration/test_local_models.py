"""Local-weight models end to end through the API: tiny random-weight diffusers pipelines
built in code and saved with ``save_pretrained``, loaded through the real loader.

Set ``GENHOOK_TEST_DEVICE=cuda`` to run them on a GPU (default: the CPU).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("diffusers")

from PIL import Image

from genhook.engines.base import EngineJob, EngineResult
from genhook.engines.local import _host, resident_models
from genhook.engines.local._host import HOST
from genhook.engines.registry import build_registry
from genhook.errors import ErrorCode, TaskFailure
from genhook.runtime.lifeline import ORPHAN_SIGNAL
from genhook.runtime.supervisor import EXIT_CANNOT_START
from genhook.tasks.worker import PreloadFailed, Worker
from genhook.tasks.worker.batch import call_batch
from tests.conftest import ROOT, Harness, make_harness, make_settings
from tests.support import in_model_process
from tests.support.images import data_url
from tests.support.postgres import free_port
from tests.support.processes import processes_with
from tests.support.tiny_pipelines import build
from tests.support.webhook_receiver import wait_until

DEVICE = os.environ.get("GENHOOK_TEST_DEVICE", "cpu")
IMAGE_FAMILIES = {
    "StableDiffusionInstructPix2PixPipeline": "edit",
    "FluxKontextPipeline": "edit",
    "QwenImageEditPipeline": "edit",
    "StableDiffusionXLPipeline": "text",
    "FluxPipeline": "text",
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    pipelines = [*IMAGE_FAMILIES, "LTXImageToVideoPipeline"]
    return {name: build(name, root / name) for name in pipelines}


def entry(pipeline: str, path: Path, **extra: Any) -> dict[str, Any]:
    video = pipeline.startswith("LTX")
    values: dict[str, Any] = {
        "id": f"local/{pipeline}",
        "kind": "video" if video else "image",
        "pipeline": pipeline,
        "path": str(path),
        "device": DEVICE,
        "dtype": "float32",
        "steps": 2,
        "generate_size": "32*32",
        "sizes": ["1024*1024", "1152*2048"],
        "price_usd": "0.01",
    }
    if video:
        values.update(frames=9)
    values.update(extra)
    return values


def unload_all() -> None:
    for model in HOST.loaded:
        HOST.run(_host.unload, model)


@pytest.fixture(autouse=True)
def fresh_residency() -> Any:
    """Each test starts with no model loaded in this process's model process."""
    unload_all()
    yield
    unload_all()


async def harness_for(tmp_path: Path, entries: list[dict[str, Any]], **extra: Any) -> Harness:
    # One worker here: it need not leave a model's tasks to another that has it loaded.
    extra.setdefault("local_models_affinity_seconds", 0.0)
    settings = make_settings(
        tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'genhook.db'}", local_models=entries, **extra
    )
    return await make_harness(settings)


async def close(harness: Harness) -> None:
    await harness.client.aclose()
    await harness.state.db.dispose()


@contextlib.asynccontextmanager
async def working(h: Harness) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The harness's worker claiming tasks in the background for the block, then the
    harness closed; the yielded ``halt()`` stops the worker earlier (a task may then run
    in the test's own hands, with ``run_task``)."""
    stop = asyncio.Event()
    running = asyncio.create_task(h.worker.run(stop))

    async def halt() -> None:
        stop.set()
        await running

    try:
        yield halt
    finally:
        await halt()
        await close(h)


def body(model: str, task: str, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model": model,
        "prompt": "a red square",
        "size": "1024*1024",
        "seed": 7,
        "output_format": "png",
        "enable_base64_output": True,
    }
    if task == "edit":
        values["images"] = [data_url((200, 30, 30))]
    values.update(extra)
    return values


async def run_task(
    h: Harness, payload: dict[str, Any], path: str = "generateImage"
) -> dict[str, Any]:
    response = await h.submit(payload, path)
    assert response.status_code == 200, response.text
    task_id = response.json()["id"]
    await h.run_all()
    logged = await h.client.get(f"/api/v1/model/result/{task_id}?logs=1", headers=h.headers)
    return logged.json()


async def test_progress_counts_steps_with_a_second_order_scheduler(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """Heun calls the pipeline back twice a step: progress still ends at the last step."""
    pipeline = "StableDiffusionXLPipeline"
    heun = tmp_path / "heun"
    shutil.copytree(weights[pipeline], heun)
    for name in ("model_index.json", "scheduler/scheduler_config.json"):
        text = (heun / name).read_text().replace("EulerDiscreteScheduler", "HeunDiscreteScheduler")
        (heun / name).write_text(text)
    h = await harness_for(tmp_path, [entry(pipeline, heun)])
    try:
        done = await run_task(h, body(f"local/{pipeline}", "text"))
        assert done["status"] == "completed", done
        steps = [line["message"] for line in done["logs"] if line["message"].startswith("step")]
        assert steps and set(steps) <= {"step 1/2", "step 2/2"}, steps
    finally:
        await close(h)


@pytest.mark.parametrize("pipeline", list(IMAGE_FAMILIES))
async def test_image_family_end_to_end(
    pipeline: str, weights: dict[str, Path], tmp_path: Path
) -> None:
    task = IMAGE_FAMILIES[pipeline]
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        first = await run_task(h, body(model, task, size="1152*2048"))
        assert first["status"] == "completed", first
        data = base64.b64decode(first["outputs"][0])
        with Image.open(io.BytesIO(data)) as picture:
            assert picture.format == "PNG" and picture.size == (1152, 2048)
        assert first["info"]["seed"] == 7 and first["info"]["generated_size"] == "32*32"
        steps = [line["message"] for line in first["logs"] if "step" in line["message"]]
        assert "step 1/2" in steps and "step 2/2" in steps
        # Same seed, request and device: the same picture; another seed: another.
        again = await run_task(h, body(model, task, size="1152*2048"))
        assert base64.b64decode(again["outputs"][0]) == data
        other = await run_task(h, body(model, task, size="1152*2048", seed=8))
        assert base64.b64decode(other["outputs"][0]) != data
        jpeg = await run_task(h, body(model, task, output_format="jpeg"))
        with Image.open(io.BytesIO(base64.b64decode(jpeg["outputs"][0]))) as picture:
            assert picture.format == "JPEG" and picture.size == (1024, 1024)
        # The entry bounds the request: sizes it does not offer, too many steps.
        refused = await h.submit(body(model, task, size="2048*2048"))
        assert refused.status_code == 400 and "size" in refused.text
        refused = await h.submit(body(model, task, num_inference_steps=101))
        assert refused.status_code == 400 and "num_inference_steps" in refused.text
        if task == "text":
            refused = await h.submit(body(model, task, images=[data_url()]))
            assert refused.status_code == 400 and "images" in refused.text
    finally:
        await close(h)


async def test_listed_moderated_and_checked_like_any_other_model(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """The catalogue lists a local model with its schema and price, the console's playground
    builds its form from that, blocked prompt terms refuse it, and the NSFW detector checks
    its inputs and flags its outputs, as for the edit engine."""
    flux, ip2p = "FluxPipeline", "StableDiffusionInstructPix2PixPipeline"
    entries = [
        entry(flux, weights[flux], description="FLUX, tiny", max_steps=8),
        entry(ip2p, weights[ip2p]),
    ]
    h = await harness_for(tmp_path, entries, moderation_blocked_terms=["banana split"])
    try:
        listed = await h.client.get(f"/api/v1/models/local/{flux}", headers=h.headers)
        model = listed.json()
        assert model["kind"] == "image" and model["description"] == "FLUX, tiny"
        assert model["submit_paths"] == ["/api/v1/model/generateImage"]
        assert model["pricing"]["prices_usd"] == {"task": "0.01"}
        properties = model["request_schema"]["properties"]
        knobs = {"prompt", "size", "seed", "num_inference_steps", "guidance_scale"}
        assert knobs <= set(properties)
        assert "images" not in properties
        assert properties["num_inference_steps"]["anyOf"][0]["maximum"] == 8
        assert properties["guidance_scale"]["anyOf"][0]["maximum"] == 50
        # The entry's sizes, and a default among them (2048*2048 is not offered).
        assert properties["size"]["enum"] == ["1024*1024", "1152*2048"]
        assert properties["size"]["default"] == "1024*1024"
        edit = (await h.client.get(f"/api/v1/models/local/{ip2p}", headers=h.headers)).json()
        assert "images" in edit["request_schema"]["properties"]

        console = httpx.AsyncClient(transport=h.client._transport, base_url="http://testserver")
        signed_in = await console.post("/console/login", data={"api_key": h.account.api_key})
        assert signed_in.status_code == 303, signed_in.text
        page = await console.get(f"/console/play/local/{flux}")
        assert page.status_code == 200, page.text
        assert 'name="num_inference_steps"' in page.text and 'name="seed"' in page.text
        assert 'name="images"' not in page.text
        await console.aclose()

        blocked = await run_task(h, body(f"local/{flux}", "text", prompt="a Banana-Split"))
        assert blocked["error_code"] == ErrorCode.MODERATION_PROMPT_BLOCKED, blocked
        unsized = body(f"local/{flux}", "text")
        del unsized["size"]
        scored = await run_task(h, unsized)
        assert scored["has_nsfw_contents"] == [False] and "nsfw_score" in scored["info"]
        assert scored["info"]["size"] == "1024*1024"
    finally:
        await close(h)
    # At a threshold of 0 every picture counts as NSFW: inputs are refused, outputs flagged.
    strict = await harness_for(tmp_path / "strict", entries, nsfw_threshold=0.0)
    try:
        refused = await run_task(strict, body(f"local/{ip2p}", "edit"))
        assert refused["error_code"] == ErrorCode.MODERATION_NSFW_INPUT, refused
        flagged = await run_task(strict, body(f"local/{flux}", "text"))
        assert flagged["status"] == "completed" and flagged["has_nsfw_contents"] == [True]
    finally:
        await close(strict)


async def test_qwen_guidance_is_true_classifier_free_guidance(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    pipeline = "QwenImageEditPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        local = h.worker.engine(model).model  # type: ignore[attr-defined]
        HOST.run(in_model_process.record_prompts, local, h.state.settings)
        # Guidance above 1 guides against a blank negative prompt (the pipeline ignores
        # true_cfg_scale without one); at 1 there is nothing to guide against.
        guided = await run_task(h, body(model, "edit", guidance_scale=4.0))
        assert guided["status"] == "completed", guided
        assert HOST.run(in_model_process.recorded_prompts) == [["a red square"], [" "]]
        plain = await run_task(h, body(model, "edit", guidance_scale=1.0))
        assert plain["status"] == "completed", plain
        assert HOST.run(in_model_process.recorded_prompts) == [["a red square"]]
    finally:
        await close(h)


async def test_image_to_video_end_to_end(weights: dict[str, Path], tmp_path: Path) -> None:
    import av

    pipeline = "LTXImageToVideoPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        payload = {
            "model": model,
            "prompt": "the square turns",
            "images": [data_url((30, 200, 30))],
            "duration": 1,
            "resolution": "480p",
            "aspect_ratio": "16:9",
            "fps": 24,
            "seed": 3,
            "enable_base64_output": True,
        }
        result = await run_task(h, payload, "generateVideo")
        assert result["status"] == "completed", result
        data = base64.b64decode(result["outputs"][0])
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            frames = list(container.decode(stream))
            assert (stream.codec_context.width, stream.codec_context.height) == (854, 480)
        assert len(frames) == 24 and result["info"]["frames_generated"] == 9
        again = await run_task(h, payload, "generateVideo")
        assert base64.b64decode(again["outputs"][0]) == data
        # Without aspect_ratio, the ratio nearest the first picture's, as for the built-in
        # model: a portrait picture, turned so by its EXIF orientation, makes a 9:16 video.
        lying = io.BytesIO()
        exif = Image.Exif()
        exif[0x0112] = 6  # rotate 90°: 48*24 as stored, 24*48 as seen
        Image.new("RGB", (48, 24), (30, 200, 30)).save(lying, "JPEG", exif=exif)
        portrait = "data:image/jpeg;base64," + base64.b64encode(lying.getvalue()).decode()
        del payload["aspect_ratio"]
        payload["images"] = [portrait]
        upright = await run_task(h, payload, "generateVideo")
        assert upright["status"] == "completed", upright
        assert upright["info"]["size"] == "480*854"
        params = {key: value for key, value in payload.items() if key != "images"}
        job = EngineJob("t", model, params, [lying.getvalue()])
        assert h.worker.engine(model).batch_key(job)[0] == (480, 854)  # type: ignore[attr-defined]
    finally:
        await close(h)


def test_a_bad_directory_is_refused_at_start(weights: dict[str, Path], tmp_path: Path) -> None:
    source = weights["FluxPipeline"]

    def registry(path: Path, pipeline: str = "FluxPipeline") -> None:
        settings = make_settings(
            tmp_path, "sqlite+aiosqlite://", local_models=[entry(pipeline, path)]
        )
        build_registry(settings)

    with pytest.raises(ValueError, match=r"entry 1 .*names the pipeline 'FluxPipeline', not"):
        registry(source, "FluxKontextPipeline")
    with pytest.raises(ValueError, match=r"model_index\.json does not exist"):
        registry(tmp_path / "nowhere")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "model_index.json").write_text((source / "model_index.json").read_text())
    with pytest.raises(ValueError, match=r"copy/scheduler \(component 'scheduler'\) does not"):
        registry(copy)
    # Pickle weights are never loaded: a component with only those is refused.
    for part in source.iterdir():
        if part.is_dir():
            (copy / part.name).mkdir()
            for file in part.iterdir():
                target = copy / part.name / file.name
                if file.suffix == ".safetensors":
                    target = target.with_suffix(".bin")
                target.write_bytes(file.read_bytes())
    with pytest.raises(ValueError, match=r"has no \.safetensors weights \(only pickle"):
        registry(copy)
    wrong_kind = entry("LTXImageToVideoPipeline", source.parent / "LTXImageToVideoPipeline")
    wrong_kind["kind"] = "image"
    settings = make_settings(tmp_path, "sqlite+aiosqlite://", local_models=[wrong_kind])
    with pytest.raises(ValueError) as invalid:
        build_registry(settings)
    # Named by position from 1 and id, on one line, without pydantic's help link.
    assert str(invalid.value) == (
        "local model entry 1 (local/LTXImageToVideoPipeline) is invalid: "
        "kind must be 'video' for LTXImageToVideoPipeline"
    )
    bad = entry("FluxPipeline", source, kind="image")
    bad["device"] = "gpu"
    settings = make_settings(tmp_path, "sqlite+aiosqlite://", local_models=[bad])
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        build_registry(settings)
    listed = tmp_path / "models.json"
    listed.write_text(json.dumps([entry("FluxPipeline", source), {"id": "x", "steps": 0}]))
    settings = make_settings(tmp_path, "sqlite+aiosqlite://", local_models_file=listed)
    with pytest.raises(ValueError) as invalid:
        build_registry(settings)
    message = str(invalid.value)
    assert message.startswith("local model entry 2 (x) is invalid: kind: Field required; "), message
    assert "steps: Input should be greater than or equal to 1" in message
    assert "\n" not in message and "pydantic.dev" not in message, message


def corrupt(source: Path, target: Path, change: Callable[[bytes], bytes]) -> Path:
    """A copy of the pipeline directory ``source`` whose transformer weights are changed."""
    shutil.copytree(source, target)
    (file,) = (target / "transformer").glob("*.safetensors")
    file.write_bytes(change(file.read_bytes()))
    return file


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        # The header's JSON broken in the middle (the loader's JSONDecodeError in a task).
        (lambda data: data[:8] + b"#" + data[9:], "its safetensors header is not valid JSON"),
        # Cut short: the header claims more than the file holds.
        (lambda data: data[:30], "its safetensors header claims"),
        # The last tensor's bytes missing.
        (lambda data: data[:-4], "outside the file's"),
        (lambda data: b"", "not a safetensors file"),
    ],
)
def test_a_weights_file_whose_header_does_not_read_is_refused_at_start(
    weights: dict[str, Path], tmp_path: Path, change: Callable[[bytes], bytes], problem: str
) -> None:
    """Every weights file's header is read at start: a corrupt one stops the start naming
    the entry, the file and the problem, instead of failing each task with 3099."""
    file = corrupt(weights["FluxPipeline"], tmp_path / "broken", change)
    configured = entry("FluxPipeline", tmp_path / "broken")
    settings = make_settings(tmp_path, "sqlite+aiosqlite://", local_models=[configured])
    with pytest.raises(ValueError) as refused:
        build_registry(settings)
    message = str(refused.value)
    assert message.startswith(f"local model entry 1 (local/FluxPipeline): {file}: "), message
    assert problem in message, message


async def test_a_weights_variant_is_loaded_and_weighed_alone(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """A hub download often holds plain and fp16 files side by side: only the entry's
    variant is loaded and weighed against the budget. A directory that holds only another
    variant is refused at start, saying which it holds; the entry's ``variant`` loads it."""
    import diffusers

    from genhook.engines.local._config import check_directory, weight_bytes

    pipeline = "FluxPipeline"
    source = weights[pipeline]
    loaded = diffusers.FluxPipeline.from_pretrained(source)
    both, only = tmp_path / "both", tmp_path / "only-fp16"
    shutil.copytree(source, both)
    loaded.save_pretrained(both, variant="fp16")
    loaded.save_pretrained(only, variant="fp16")
    plain = check_directory(source, pipeline)
    assert check_directory(both, pipeline) == [both / f.relative_to(source) for f in plain]
    fp16 = check_directory(both, pipeline, "fp16")
    assert fp16 and all(".fp16" in file.name for file in fp16)
    assert weight_bytes(fp16, "float32") == weight_bytes(plain, "float32")
    settings = make_settings(tmp_path, "sqlite+aiosqlite://", local_models=[entry(pipeline, only)])
    with pytest.raises(ValueError, match=r"has no plain \.safetensors weights, only: fp16;"):
        build_registry(settings)
    h = await harness_for(tmp_path, [entry(pipeline, only, variant="fp16")])
    try:
        done = await run_task(h, body(f"local/{pipeline}", "text"))
        assert done["status"] == "completed", done
    finally:
        await close(h)


async def wait_for_progress(h: Harness, task_id: str) -> None:
    for _ in range(1200):
        data = await h.result(task_id)
        if (data.get("progress") or 0) > 0.05:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no denoising progress")


async def engine_stopped(worker: Worker) -> None:
    """The pipeline call ends at the next step (400 steps would run for minutes here)."""
    for _ in range(1200):
        if not worker._engine_tasks:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the pipeline call went on after the task was given up")


@pytest.mark.parametrize(("steps", "step_seconds"), [(400, 0.0), (20, 1.2)])
async def test_cancel_in_the_middle_of_denoising(
    weights: dict[str, Path], tmp_path: Path, steps: int, step_seconds: float
) -> None:
    """The call stops at the end of its step, and the worker serves the next task. A large
    model's step takes a second or more (``step_seconds``): the worker waits for it to end,
    rather than counting the call as stuck and leaving."""
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    slow = entry(pipeline, weights[pipeline], steps=steps, max_steps=steps)
    h = await harness_for(
        tmp_path, [slow], progress_interval_seconds=0.05, cancel_check_seconds=0.1
    )
    if step_seconds:
        local = h.worker.engine(model).model  # type: ignore[attr-defined]
        HOST.run(in_model_process.slow_steps, local, h.state.settings, step_seconds)
    async with working(h) as halt:
        response = await h.submit(body(model, "text"))
        task_id = response.json()["id"]
        await wait_for_progress(h, task_id)
        await asyncio.sleep(step_seconds / 4)  # into the next step
        await cancel(h, task_id)
        await engine_stopped(h.worker)
        assert (await h.result(task_id))["status"] == "canceled"
        assert not h.worker.tainted
        await halt()
        # The pipeline stopped mid-call serves the next task.
        done = await run_task(h, body(model, "text", num_inference_steps=1))
        assert done["status"] == "completed", done


async def test_a_stuck_call_is_ended_with_its_model_process(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """A call that never reaches the end of its step (a hung kernel, here in its second):
    once it has gone twice its model's slowest step without one, the worker ends its model
    process rather than leave, and serves the next task from a new one."""
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])], cancel_check_seconds=0.1)
    local = h.worker.engine(model).model  # type: ignore[attr-defined]
    assert (await run_task(h, body(model, "text")))["status"] == "completed"  # steps timed
    hanging = tmp_path / "hanging"
    HOST.run(in_model_process.hang_in_call, local, h.state.settings, str(hanging))
    stuck = HOST.pid()
    async with working(h) as halt:
        task_id = (await h.submit(body(model, "text"))).json()["id"]

        async def hung() -> bool:
            return hanging.exists()

        await wait_until(hung, timeout=60)
        await cancel(h, task_id)
        await engine_stopped(h.worker)
        assert (await h.result(task_id))["status"] == "canceled"
        assert not h.worker.tainted and HOST.pid() != stuck
        await halt()
        done = await run_task(h, body(model, "text"))
        assert done["status"] == "completed", done


async def cancel(h: Harness, task_id: str) -> None:
    canceled = await h.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=h.headers)
    assert canceled.status_code == 200, canceled.text


async def in_engine(worker: Worker, task_id: str) -> None:
    """Until the task's engine call has started (its inputs ready, its call sent or waiting)."""
    for _ in range(1200):
        if task_id in worker._engine_tasks:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the task's engine call did not start")


async def slowed(
    weights: dict[str, Path], tmp_path: Path, slow: str, seconds: float
) -> tuple[Harness, str]:
    """A harness whose SDXL model takes ``seconds`` longer for each step (``slow`` is "first
    step") or for its next load ("load": it is unloaded first); and the model's id."""
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])], cancel_check_seconds=0.1)
    local = h.worker.engine(model).model  # type: ignore[attr-defined]
    if slow == "first step":
        # Its steps timed at their own speed first: the slow call is heavier than any before.
        assert (await run_task(h, body(model, "text")))["status"] == "completed"
        HOST.run(in_model_process.slow_steps, local, h.state.settings, seconds)
    else:
        HOST.run(_host.unload, model)
        HOST.run(in_model_process.slow_loads, seconds)
    return h, model


@pytest.mark.parametrize("slow", ["first step", "load"])
async def test_a_call_is_not_cut_short_before_its_first_step(
    weights: dict[str, Path], tmp_path: Path, slow: str
) -> None:
    """A call's first step (a card's warm-up; a call heavier than any the model has made,
    as here) has no measure yet, and a load (of a model unloaded for another) may take
    minutes: a task given up then waits for the first step or the load to end, rather than
    end the model process and the models it has loaded."""
    h, model = await slowed(weights, tmp_path, slow, 1.5 if slow == "first step" else 2.0)
    process = HOST.pid()
    async with working(h):
        try:
            task_id = (await h.submit(body(model, "text"))).json()["id"]
            await in_engine(h.worker, task_id)
            await asyncio.sleep(0.6)  # past the worker's usual wait for a call to stop
            await cancel(h, task_id)
            await engine_stopped(h.worker)
            assert (await h.result(task_id))["status"] == "canceled"
            assert not h.worker.tainted
            assert HOST.pid() == process and model in HOST.loaded
        finally:
            HOST.run(in_model_process.slow_loads, 0.0)


async def test_a_stop_after_a_cancel_does_not_wait_for_the_load(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """A task canceled while its model loads leaves the load running; a shutdown that comes
    while the worker waits for it no longer waits for that load."""
    h, model = await slowed(weights, tmp_path, "load", 3600.0)
    h.state.settings.shutdown_grace_seconds = 0.2
    try:
        async with working(h) as halt:
            task_id = (await h.submit(body(model, "text"))).json()["id"]
            await in_engine(h.worker, task_id)
            await cancel(h, task_id)
            await asyncio.sleep(1.0)  # the worker waits for the given-up call's load
            async with asyncio.timeout(20):
                await halt()
    finally:
        HOST.abort()  # nothing of this test outlives it, even when it fails
        HOST.run(in_model_process.slow_loads, 0.0)


async def test_a_task_given_up_while_its_batch_is_prepared_leaves_the_call_to_the_others(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """Canceled while the batch's other inputs were prepared: that job alone ends, and the
    others share one pipeline call, rather than each running alone after a failed batch."""
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline], max_batch_size=4)])
    try:
        engine: Any = h.worker.engine(model)
        generate, prepare = engine._generate, engine._prepare
        calls: list[int] = []
        params = {"prompt": "a red square", "size": "1024*1024", "output_format": "png"}
        jobs = [
            EngineJob(f"t{seed}", model, {**params, "seed": seed}, [], deadline=time.time() + 600)
            for seed in range(3)
        ]

        def counted(prepared: list[Any]) -> Any:
            calls.append(len(prepared))
            return generate(prepared)

        def prepare_then_cancel(job: EngineJob) -> Any:
            prepared = prepare(job)
            if job is jobs[2]:
                jobs[0].stop.set()
            return prepared

        engine._generate, engine._prepare = counted, prepare_then_cancel
        ended = call_batch(engine, jobs)
        assert calls == [2]
        assert isinstance(ended[0], TaskFailure) and "stopped early" in ended[0].message
        assert [type(result) for result in ended[1:]] == [EngineResult, EngineResult]
    finally:
        await close(h)


@pytest.mark.parametrize("slow", ["first step", "load"])
async def test_shutdown_does_not_wait_for_a_load_or_first_step(
    weights: dict[str, Path], tmp_path: Path, slow: str
) -> None:
    """A worker on its way out keeps no model for a next task: past its grace it ends the
    model process in the middle of a load or a first step (here: ones that never end), rather
    than wait for them."""
    h, model = await slowed(weights, tmp_path, slow, 3600.0)
    h.state.settings.shutdown_grace_seconds = 0.2
    process = HOST.pid()
    async with working(h) as halt:
        task_id = (await h.submit(body(model, "text"))).json()["id"]
        await in_engine(h.worker, task_id)
        try:
            async with asyncio.timeout(45):  # rather than an hour, or a minute for the first step
                await halt()
        finally:
            HOST.abort()  # nothing of this test outlives it, even when it fails
        assert HOST.pid() != process
        assert (await h.result(task_id))["status"] == "created"  # back in the queue


async def test_a_call_given_up_while_waiting_its_turn_leaves_the_running_one_alone(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """With concurrency 2, a task given up while its call waits for the other task's call to
    end leaves at once; the other call goes on and completes."""
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(
        tmp_path,
        [entry(pipeline, weights[pipeline], steps=6)],
        model_batching={model: {"concurrency": 2}},
        progress_interval_seconds=0.05,
        cancel_check_seconds=0.1,
    )
    local = h.worker.engine(model).model  # type: ignore[attr-defined]
    HOST.run(in_model_process.slow_steps, local, h.state.settings, 0.4)
    process = HOST.pid()
    async with working(h):
        first = (await h.submit(body(model, "text", seed=1))).json()["id"]
        await wait_for_progress(h, first)
        second = (await h.submit(body(model, "text", seed=2))).json()["id"]
        await in_engine(h.worker, second)
        await cancel(h, second)

        async def ended() -> bool:
            return (await h.result(first))["status"] not in ("created", "processing")

        await wait_until(ended, timeout=120)
        assert (await h.result(first))["status"] == "completed"
        assert (await h.result(second))["status"] == "canceled"
        assert not h.worker.tainted and HOST.pid() == process


async def test_deadline_stops_denoising(weights: dict[str, Path], tmp_path: Path) -> None:
    pipeline = "StableDiffusionXLPipeline"
    model = f"local/{pipeline}"
    slow = entry(pipeline, weights[pipeline], steps=400, max_steps=400, deadline_seconds=1.5)
    h = await harness_for(tmp_path, [slow])
    try:
        h.worker.engine(model).load()  # the deadline is the call's, not the load's
        result = await run_task(h, body(model, "text"))
        assert result["error_code"] == ErrorCode.TIMEOUT, result
        await engine_stopped(h.worker)
    finally:
        await close(h)


@pytest.mark.parametrize(
    ("fault", "code", "message"),
    [
        ("exhaust_memory", ErrorCode.ENGINE_OUT_OF_MEMORY, "ran out of memory generating 32*32"),
        ("exhaust_cpu_memory", ErrorCode.ENGINE_OUT_OF_MEMORY, "ran out of memory generating"),
    ],
)
async def test_a_failed_call_fails_its_task_and_the_worker_goes_on(
    fault: str, code: ErrorCode, message: str, weights: dict[str, Path], tmp_path: Path
) -> None:
    """An out-of-memory leaves the model process and its models as they were; a crashed
    model process is started again, empty, for the next task, which loads its model again."""
    pipeline = "FluxPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        local = h.worker.engine(model).model  # type: ignore[attr-defined]
        HOST.run(getattr(in_model_process, fault), local, h.state.settings)
        process = HOST.pid()
        failed = await run_task(h, body(model, "text"))
        assert failed["status"] == "failed", failed
        assert failed["error_code"] == code and message in failed["error"], failed
        survived = fault.startswith("exhaust")
        if survived:
            assert HOST.pid() == process and HOST.loaded == {model}
            # Nothing of the failed call is held while the next one runs.
            assert HOST.run(in_model_process.activations_held) == 0
            HOST.run(in_model_process.restore, local, h.state.settings)
        else:
            assert HOST.pid() is None and HOST.loaded == frozenset()
        assert (await run_task(h, body(model, "text")))["status"] == "completed"
        assert HOST.loaded == {model} and (HOST.pid() == process) == survived
    finally:
        await close(h)


async def test_a_model_process_that_dies_in_the_call_runs_its_task_again_once(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """A model process killed in the middle of a call (the kernel's out-of-memory killer
    sends SIGKILL): the task runs again on a fresh model process, counted as a lost lease;
    when that one dies too, the task fails with MODEL_PROCESS_DIED, saying how."""
    pipeline = "FluxPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        local = h.worker.engine(model).model  # type: ignore[attr-defined]
        HOST.run(in_model_process.killed_in_call, local, h.state.settings)
        first = HOST.pid()
        response = await h.submit(body(model, "text"))
        task_id = response.json()["id"]
        assert await h.worker.run_turn()
        again = await h.result(task_id)
        assert again["status"] == "created", again
        assert HOST.pid() is None and HOST.loaded == frozenset()
        # Dies again on the fresh process: the task fails, and says why.
        HOST.run(in_model_process.killed_in_call, local, h.state.settings)
        assert HOST.pid() not in (None, first)
        assert await h.worker.run_turn()
        failed = await h.result(task_id)
        assert failed["status"] == "failed", failed
        assert failed["error_code"] == ErrorCode.MODEL_PROCESS_DIED, failed
        assert "SIGKILL" in failed["error"] and "out-of-memory" in failed["error"], failed
    finally:
        await close(h)


async def test_a_model_process_killed_between_tasks_is_started_again(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """The kernel's out-of-memory killer may pick the model process while it waits for a
    call: the next task starts a new one, loads its model there and completes."""
    pipeline = "FluxPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(tmp_path, [entry(pipeline, weights[pipeline])])
    try:
        h.worker.engine(model)
        process = HOST.pid()
        assert process is not None
        os.kill(process, signal.SIGKILL)
        for _ in range(200):
            if HOST.pid() is None:
                break
            await asyncio.sleep(0.05)
        assert resident_models() == frozenset()  # affinity no longer counts it loaded here
        done = await run_task(h, body(model, "text"))
        assert done["status"] == "completed", done
        assert HOST.pid() not in (None, process) and HOST.loaded == {model}
    finally:
        await close(h)


async def test_lru_eviction_under_a_small_budget(weights: dict[str, Path], tmp_path: Path) -> None:
    flux, sdxl = "FluxPipeline", "StableDiffusionXLPipeline"
    entries = [entry(flux, weights[flux]), entry(sdxl, weights[sdxl])]
    from genhook.engines.local._config import check_directory, weight_bytes

    sizes = [weight_bytes(check_directory(weights[p], p), "float32") for p in (flux, sdxl)]
    # Room for either model alone, never both.
    budget_gb = (max(sizes) + min(sizes) // 2) / (1 << 30)
    h = await harness_for(tmp_path, entries, local_models_memory_gb=budget_gb)
    try:
        assert (await run_task(h, body(f"local/{flux}", "text")))["status"] == "completed"
        assert HOST.loaded == {f"local/{flux}"}
        assert (await run_task(h, body(f"local/{sdxl}", "text")))["status"] == "completed"
        assert HOST.loaded == {f"local/{sdxl}"}
        assert (await run_task(h, body(f"local/{flux}", "text")))["status"] == "completed"
        assert HOST.loaded == {f"local/{flux}"}
    finally:
        await close(h)


async def test_models_preloaded_that_do_not_fit_together_stop_the_start(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """Each fits the budget alone, not both: the second's load would unload the first, so
    the worker refuses to start rather than report ready without it."""
    flux, sdxl = "FluxPipeline", "StableDiffusionXLPipeline"
    from genhook.engines.local._config import check_directory, weight_bytes

    sizes = [weight_bytes(check_directory(weights[p], p), "float32") for p in (flux, sdxl)]
    h = await harness_for(
        tmp_path,
        [entry(flux, weights[flux]), entry(sdxl, weights[sdxl])],
        local_models_memory_gb=(max(sizes) + min(sizes) // 2) / (1 << 30),
        preload_models=[f"local/{flux}", f"local/{sdxl}"],
    )
    try:
        with pytest.raises(PreloadFailed, match=f"cannot preload local/{flux} beside the models"):
            await h.worker.preload()
        assert not h.worker.preloaded
    finally:
        await close(h)


async def test_weights_gone_since_the_start_stop_a_preload_in_one_line(
    weights: dict[str, Path], tmp_path: Path
) -> None:

    pipeline = "FluxPipeline"
    copy = tmp_path / "copy"
    shutil.copytree(weights[pipeline], copy)
    h = await harness_for(tmp_path, [entry(pipeline, copy)], preload_models=[f"local/{pipeline}"])
    try:
        shutil.rmtree(copy / "transformer")
        with pytest.raises(PreloadFailed, match=f"^cannot preload local/{pipeline}: .*transformer"):
            await h.worker.preload()
    finally:
        await close(h)


@pytest.mark.parametrize("batch", [1, 2])
async def test_a_model_that_cannot_fit_is_refused_at_load(
    batch: int, weights: dict[str, Path], tmp_path: Path
) -> None:
    """Alone or batched, the task says why (3020, the budget), not "failed unexpectedly"."""
    pipeline = "FluxPipeline"
    h = await harness_for(
        tmp_path,
        [entry(pipeline, weights[pipeline], max_batch_size=batch)],
        local_models_memory_gb=1e-6,
    )
    try:
        failed = await run_task(h, body(f"local/{pipeline}", "text"))
        assert failed["status"] == "failed" and failed["error_code"] == 3020, failed
        assert "budget" in failed["error"] and HOST.loaded == frozenset()
    finally:
        await close(h)


def test_a_card_is_named_by_its_number(
    weights: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cuda``, ``auto`` and ``cuda:1`` on a worker whose current card is 1 are one device
    with one memory budget, not three."""
    import torch

    from genhook.engines.local._config import LocalModel
    from genhook.engines.local._residency import DeviceUnavailable, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    settings = make_settings(tmp_path, "sqlite+aiosqlite://")

    def device(name: str) -> str:
        model = LocalModel.model_validate(entry("FluxPipeline", weights["FluxPipeline"]))
        return resolve_device(model.model_copy(update={"device": name}), settings)

    assert [device(name) for name in ("cuda", "auto", "cuda:1", "cuda:0")] == [
        "cuda:1",
        "cuda:1",
        "cuda:1",
        "cuda:0",
    ]
    with pytest.raises(DeviceUnavailable, match="this worker sees 2 CUDA device"):
        device("cuda:2")


async def test_a_model_on_a_missing_device_fails_its_task_and_stops_a_preloading_worker(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """A device the worker does not have (no CUDA in its torch, no such card) is named in the
    task's error; ``genhook worker --preload`` stops with that one line, exit status 1 (a
    worker of ``genhook serve``: the status that tells its supervisor it could not start)."""
    pipeline = "FluxPipeline"
    model = f"local/{pipeline}"
    entries = [entry(pipeline, weights[pipeline], device="cuda:99")]
    message = f"local model '{model}' is set to run on cuda:99, but"
    h = await harness_for(tmp_path, entries)
    try:
        failed = await run_task(h, body(model, "text"))
        assert failed["error_code"] == ErrorCode.ENGINE_ERROR, failed
        assert failed["error"].startswith(message), failed
        settings = h.state.settings
        supervised = (
            "import os; from genhook.cli._environment import load_settings; "
            "from genhook.runtime.roles import worker_main; "
            "worker_main(load_settings(), 0, os.getppid())"
        )
        for command, status in (
            (["-m", "genhook.cli", "worker", "--preload", model], 1),
            (["-c", supervised], EXIT_CANNOT_START),
        ):
            result = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, *command],
                env={
                    **os.environ,
                    "GENHOOK_DATA_DIR": str(settings.data_dir),
                    "GENHOOK_DATABASE_URL": settings.database_url or "",
                    "GENHOOK_LOCAL_MODELS": json.dumps(entries),
                    "GENHOOK_PRELOAD_MODELS": json.dumps([model]),
                    "GENHOOK_HEALTH_PORT": str(free_port()),
                    "PYTHONPATH": os.pathsep.join(
                        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
                    ),
                },
                capture_output=True,
                text=True,
                timeout=120,
            )
            output = result.stdout + result.stderr
            assert result.returncode == status, output
            assert f"cannot preload {model}: {message}" in output, output
            assert "Traceback" not in output, output
    finally:
        await close(h)


async def test_affinity_the_loaded_worker_wins(weights: dict[str, Path], tmp_path: Path) -> None:
    """Two workers in two processes on one database: this process has the model loaded, a
    ``genhook worker`` process has not. The cold one leaves a fresh task to the loaded one, and
    takes a task once it has waited the affinity time."""
    pipeline = "FluxPipeline"
    model = f"local/{pipeline}"
    affinity = 8.0
    entries = [entry(pipeline, weights[pipeline])]
    h = await harness_for(
        tmp_path, entries, local_models_affinity_seconds=affinity, preload_models=[model]
    )
    warm = h.worker
    settings = h.state.settings
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(settings.data_dir),
        "GENHOOK_DATABASE_URL": settings.database_url or "",
        "GENHOOK_LOCAL_MODELS": json.dumps(entries),
        "GENHOOK_LOCAL_MODELS_AFFINITY_SECONDS": str(affinity),
        "GENHOOK_WORKER_POLL_SECONDS": "0.05",
        "GENHOOK_HEALTH_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    log_path = tmp_path / "cold-worker.log"
    with log_path.open("wb") as log:
        cold = subprocess.Popen(
            [sys.executable, "-m", "genhook.cli", "worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        await warm.preload()
        assert warm.preloaded and HOST.loaded == {model}
        await _ready(f"http://127.0.0.1:{env['GENHOOK_HEALTH_PORT']}/readyz", cold, log_path)
        # A fresh task: the cold process, polling every 50 ms, leaves it alone.
        first = (await h.submit(body(model, "text"))).json()["id"]
        await asyncio.sleep(1.5)
        assert (await h.result(first))["status"] == "created", log_path.read_text()
        assert await warm.run_turn()
        assert (await h.result(first))["status"] == "completed"
        # With the loaded worker busy elsewhere (it is not run again here), the cold process
        # takes the next task, but only once it has waited the affinity time.
        submitted = time.monotonic()
        second = (await h.submit(body(model, "text"))).json()["id"]
        status = "created"
        while status == "created":
            assert time.monotonic() - submitted < affinity + 90, log_path.read_text()
            await asyncio.sleep(0.1)
            status = (await h.result(second))["status"]
        assert time.monotonic() - submitted >= affinity - 0.5
        while status not in ("completed", "failed"):
            assert time.monotonic() - submitted < affinity + 120, log_path.read_text()
            await asyncio.sleep(0.2)
            status = (await h.result(second))["status"]
        assert status == "completed", log_path.read_text()
        # The cold worker started its model process for the task; killed outright, it takes
        # that process (and multiprocessing's resource tracker) with it.
        port = env["GENHOOK_HEALTH_PORT"]
        spawned = [
            pid
            for pid in processes_with("GENHOOK_HEALTH_PORT", port)
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(spawned) == 1, log_path.read_text()
        cold.kill()
        cold.wait(10)
        for _ in range(100):
            if not processes_with("GENHOOK_HEALTH_PORT", port):
                break
            await asyncio.sleep(0.1)
        assert not processes_with("GENHOOK_HEALTH_PORT", port), "the model process outlived it"
    finally:
        cold.terminate()
        try:
            cold.wait(30)
        except subprocess.TimeoutExpired:
            cold.kill()
            cold.wait(5)
        await close(h)


async def _ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text()
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=1) as client:
                if (await client.get(url)).status_code == 200:
                    return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the cold worker never became ready:\n{log_path.read_text()}")


async def test_tasks_of_one_shape_share_a_pipeline_call(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    pipeline = "StableDiffusionInstructPix2PixPipeline"
    model = f"local/{pipeline}"
    configured = entry(pipeline, weights[pipeline], max_batch_size=4, max_wait_ms=0)
    h = await harness_for(tmp_path, [configured])
    try:
        calls: list[int] = []
        engine: Any = h.worker.engine(model)
        generate = engine._generate

        def counted(prepared: list[Any]) -> Any:
            calls.append(len(prepared))
            return generate(prepared)

        engine._generate = counted
        ids = []
        for seed in range(6):
            size = "1152*2048" if seed == 5 else "1024*1024"  # another shape: its own call
            response = await h.submit(body(model, "edit", seed=seed, size=size), "generateImage")
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])
        await h.run_all()
        assert sorted(calls) == [1, 1, 4], calls
        outputs = set()
        for seed, task_id in enumerate(ids):
            result = (
                await h.client.get(f"/api/v1/model/result/{task_id}", headers=h.headers)
            ).json()
            assert result["status"] == "completed", result
            assert result["info"]["seed"] == seed
            data = base64.b64decode(result["outputs"][0])
            outputs.add(data)
            with Image.open(io.BytesIO(data)) as picture:
                assert picture.size == ((1152, 2048) if seed == 5 else (1024, 1024))
        assert len(outputs) == 6  # each task has its own picture, from its own seed
    finally:
        await close(h)


@pytest.mark.parametrize(("workers", "cpu_threads"), [(64, 0), (1, 0), (1, 1)])
async def test_a_call_takes_the_process_share_of_the_cores(
    weights: dict[str, Path], tmp_path: Path, workers: int, cpu_threads: int
) -> None:
    """Torch computes on the worker process's share of the cores it may use, as the ONNX
    models do (or on ``local_models_cpu_threads``), in the worker's model process:
    ``genhook serve``'s worker processes, each on every core, ran over ten times slower. On
    the CPU the pictures' NSFW checks take turns with the calls and get the same share, their
    threads sleeping rather than spinning between checks (the next call needs the cores)."""
    pipeline = "StableDiffusionInstructPix2PixPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(
        tmp_path,
        [entry(pipeline, weights[pipeline])],
        workers=workers,
        local_models_cpu_threads=cpu_threads,
    )
    engine: Any = h.worker.engine(model)
    engine.load()
    HOST.run(in_model_process.set_threads, 7)
    try:
        result = await run_task(h, body(model, "edit"))
        assert result["status"] == "completed", result
        share = cpu_threads or max(1, len(os.sched_getaffinity(0)) // workers)
        assert HOST.run(in_model_process.threads) == share
        options = engine.detector._session.get_session_options()
        assert options.intra_op_num_threads == (share if DEVICE == "cpu" else 1)
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    finally:
        await close(h)


async def test_concurrent_calls_of_one_model_take_turns_at_the_pipeline(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """With concurrency 2 a model's tasks run in two threads, and the model process makes
    their calls one at a time: each task gets the picture its seed makes alone, not the
    other call's."""
    pipeline = "StableDiffusionInstructPix2PixPipeline"
    model = f"local/{pipeline}"
    h = await harness_for(
        tmp_path,
        [entry(pipeline, weights[pipeline])],
        model_batching={model: {"concurrency": 2}},
    )
    async with working(h) as halt:
        ids = []
        for seed in (1, 2, 3, 4):
            response = await h.submit(body(model, "edit", seed=seed))
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])

        async def finished() -> bool:
            states = [(await h.result(task_id))["status"] for task_id in ids]
            return all(state not in ("created", "processing") for state in states)

        await wait_until(finished, timeout=120)
        results = [await h.result(task_id) for task_id in ids]
        assert [r["status"] for r in results] == ["completed"] * 4, results
        assert [r["info"]["seed"] for r in results] == [1, 2, 3, 4]
        assert len({r["outputs"][0] for r in results}) == 4
        await halt()
        for seed, together in zip((1, 4), (results[0], results[3]), strict=True):
            alone = await run_task(h, body(model, "edit", seed=seed))
            assert alone["outputs"] == together["outputs"]


def test_a_start_logs_no_torchvision_fallback_notice(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    """Without torchvision, transformers says on every load that an image processor "falls
    back" to its Pillow twin (the one meant here): the service log leaves those lines out."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from genhook.config import Settings\n"
        "from genhook.logs import configure_logging\n"
        "from genhook.engines.local._config import LocalModel\n"
        "from genhook.engines.local._residency import load_pipeline\n"
        "configure_logging(Settings(), 'worker')\n"
        "model = LocalModel(id='m', kind='image', pipeline='FluxPipeline',\n"
        "                   path=Path(sys.argv[1]), dtype='float32')\n"
        "load_pipeline(model, 'cpu', 'float32')\n"
        "print('loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", script, str(weights["FluxPipeline"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "loaded" in result.stdout, output
    assert "torchvision" not in output, output


def test_the_model_process_ends_as_its_worker_end_of_the_lifeline_closes() -> None:
    """The model process waits on a pipe that only its worker holds, which the kernel closes
    when the worker dies however it dies: closing that end (the worker still alive) ends the
    process, at once rather than at a poll of its parent's id. The next command starts
    another."""
    HOST.run(_host.unload, "nothing")
    process = HOST._process
    assert process is not None and HOST._lifeline is not None
    HOST._lifeline.close()
    process.join(60)
    assert process.exitcode == -ORPHAN_SIGNAL
    HOST.run(_host.unload, "nothing")
    assert HOST.pid() not in (None, process.pid)


def test_the_model_process_ends_when_its_worker_is_killed(tmp_path: Path) -> None:
    """A worker killed outright (SIGKILL, mid-call or idle) takes its model process with it:
    nothing of a dead worker holds a device."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    script = (
        "from genhook.engines.local import _host\n"
        "from genhook.engines.local._host import HOST\n"
        "HOST.run(_host.unload, 'nothing')\n"
        "print(HOST.pid(), flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "GENHOOK_TEST_MARK": mark,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        },
        cwd=tmp_path,
    )
    try:
        assert worker.stdout is not None
        model_process = int(worker.stdout.readline())
        assert model_process in processes_with("GENHOOK_TEST_MARK", mark)
        worker.kill()
        worker.wait()
        for _ in range(600):
            if not processes_with("GENHOOK_TEST_MARK", mark):
                break
            time.sleep(0.05)
        assert not processes_with("GENHOOK_TEST_MARK", mark), "the model process outlived it"
    finally:
        worker.kill()
        worker.wait()
        for pid in processes_with("GENHOOK_TEST_MARK", mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_stop_ends_its_own_command_and_never_the_next() -> None:
    """The worker's stop goes on the command pipe: a call reads it between its steps; one that
    arrives as its command ends (a command that never looked) is dropped, and the next
    command starts unasked."""
    assert HOST.run(in_model_process.until_asked_to_stop, 60.0, stop=lambda: True)
    HOST.run(in_model_process.busy, 0.5, stop=lambda: True)
    assert not HOST.run(in_model_process.asked_to_stop)
    assert not HOST.run(in_model_process.until_asked_to_stop, 0.2)
