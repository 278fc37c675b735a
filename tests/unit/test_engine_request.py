"""Engines receive the request their model's schema validated at submit: the worker parses
the stored params once with that schema, and the schema alone holds the defaults."""

from __future__ import annotations

from pathlib import Path

from genhook.config import Settings
from genhook.db import Task
from genhook.engines.audio._requests import TextToSpeechRequest
from genhook.engines.audio._tts import TextToSpeechEngine
from genhook.engines.base import EngineJob, stored_request
from genhook.engines.edit_request import EditRequest
from genhook.engines.registry import IMAGE_EDIT_MODEL_ID, build_registry
from genhook.engines.video_request import VideoRequest
from genhook.runtime.services import open_services
from genhook.tasks.worker import Worker

TTS = "genhook/text-to-speech"


def test_a_task_older_than_a_field_gets_the_schema_default() -> None:
    request = stored_request(EditRequest, {"model": IMAGE_EDIT_MODEL_ID, "prompt": "invert"})
    assert isinstance(request, EditRequest)
    assert (request.prompt, request.size, request.output_format) == ("invert", "2048*2048", "jpeg")
    assert request.dimensions == (2048, 2048)
    video = stored_request(VideoRequest, {"prompt": "zoom in", "duration": 3})
    assert (video.duration, video.fps, video.resolution, video.aspect_ratio) == (
        3,
        30,
        "720p",
        None,
    )


async def test_the_worker_parses_the_stored_params_with_the_model_schema(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    services = open_services(settings, registry=build_registry(settings))
    worker = Worker.sharing(services, worker_id="w-test")
    task = Task(id="t1", model=TTS, params={"model": TTS, "prompt": "hello", "speed": 1.5})
    request = worker.request_of(task)
    assert isinstance(request, TextToSpeechRequest)
    assert (request.prompt, request.speed, request.voice, request.sample_rate) == (
        "hello",
        1.5,
        "joe",
        24000,
    )
    assert worker.request_of(Task(id="t2", model="no/such-model", params={})) is None
    await services.db.dispose()


def test_the_engine_reads_the_request_it_is_handed() -> None:
    engine = TextToSpeechEngine(Settings(workers=1))
    engine.load()
    request = TextToSpeechRequest(
        model=TTS, prompt="One two three.", output_format="wav", sample_rate=16000
    )
    # The params say otherwise: the engine must go by the validated request.
    job = EngineJob("t", TTS, {"prompt": "ignored", "sample_rate": 48000}, [], request=request)
    assert job.request_as(TextToSpeechRequest) is request
    result = engine.run(job)
    assert (result.info["sample_rate"], result.info["output_format"]) == (16000, "wav")
    assert result.outputs[0].content_type == "audio/wav"
