"""LoRA adapters of local models, per request: applied exactly as diffusers applies them,
undone exactly, kept loaded under the budget, split into their own batches, and by URL only
under the address policy. Tiny random-weight pipelines and PEFT-made random adapters."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("peft")

from PIL import Image

from genhook.config import Settings
from genhook.engines.local import load_local_models, resident_adapters
from genhook.engines.local._config import weight_bytes
from genhook.engines.local._host import HOST
from genhook.engines.media import output as _output
from genhook.errors import ErrorCode
from tests.integration.test_local_models import (
    body,
    close,
    entry,
    fresh_residency,
    harness_for,
    run_task,
)
from tests.support.tiny_loras import random_loras, residency_counts
from tests.support.tiny_pipelines import build

__all__ = ["fresh_residency"]  # autouse: every test starts with nothing loaded

SDXL = "StableDiffusionXLPipeline"
MODEL = f"local/{SDXL}"
NAMES = ["film", "noir", "ink", "oil", "pop"]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pipeline's directory (``base``) and five adapters' folders."""
    root = tmp_path_factory.mktemp("loras")
    base = build(SDXL, root / "sdxl")
    folders = random_loras(base, SDXL, [root / name for name in NAMES])
    return {"base": base, **dict(zip(NAMES, folders, strict=True))}


def lora_entry(made: dict[str, Path], **extra: Any) -> dict[str, Any]:
    loras = {name: {"path": str(made[name])} for name in NAMES}
    # One given as its file, the others as the folder diffusers saves.
    loras["noir"]["path"] = str(made["noir"] / "pytorch_lora_weights.safetensors")
    loras["film"].update(description="grainy film", price_usd="0.002")
    return entry(SDXL, made["base"], loras=loras, **extra)


def picture(result: dict[str, Any]) -> bytes:
    assert result["status"] == "completed", result
    return base64.b64decode(result["outputs"][0])


def direct(made: dict[str, Path], adapters: list[tuple[str, float]]) -> np.ndarray:
    """The picture diffusers makes, called directly with the adapters, as the engine's
    request asks (the entry's steps, guidance and generated size; seed 7), fitted to the
    output size as every local model's picture is."""
    import diffusers
    import torch

    pipe = diffusers.StableDiffusionXLPipeline.from_pretrained(made["base"], local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    for name, _ in adapters:
        pipe.load_lora_weights(str(made[name]), adapter_name=name)
    pipe.set_adapters([n for n, _ in adapters], [s for _, s in adapters])
    torch.set_num_threads(1)
    out = pipe(
        prompt=["a red square"],
        num_inference_steps=2,
        height=32,
        width=32,
        guidance_scale=3.5,
        generator=[torch.Generator("cpu").manual_seed(7)],
    ).images[0]
    fitted = _output.fit(out.convert("RGB"), (1024, 1024), "cover", "white", False)
    return np.asarray(fitted)


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


async def test_an_adapter_is_applied_as_diffusers_applies_it_and_undone_exactly(
    made: dict[str, Path], tmp_path: Path
) -> None:
    h = await harness_for(tmp_path, [lora_entry(made)], local_models_cpu_threads=1)
    try:
        plain = picture(await run_task(h, body(MODEL, "text")))
        counts = HOST.run(residency_counts)
        film = await run_task(h, body(MODEL, "text", loras=[{"name": "film", "scale": 0.8}]))
        with_film = picture(film)
        assert with_film != plain
        assert film["info"]["loras"] == [{"name": "film", "scale": 0.8}]
        assert np.array_equal(pixels(with_film), direct(made, [("film", 0.8)]))
        # The next plain request is the picture of one that never saw an adapter.
        assert picture(await run_task(h, body(MODEL, "text"))) == plain
        # Scale 0 is no adapter at all.
        zero = await run_task(h, body(MODEL, "text", loras=[{"name": "film", "scale": 0.0}]))
        assert picture(zero) == plain
        # Reproducible; two adapters together are another picture, as diffusers makes it.
        again = await run_task(h, body(MODEL, "text", loras=[{"name": "film", "scale": 0.8}]))
        assert picture(again) == with_film
        both = [{"name": "film", "scale": 0.8}, {"name": "noir"}]
        two = picture(await run_task(h, body(MODEL, "text", loras=both)))
        assert two not in (plain, with_film)
        assert np.array_equal(pixels(two), direct(made, [("film", 0.8), ("noir", 1.0)]))
        assert picture(await run_task(h, body(MODEL, "text"))) == plain
        # No model load after the first: adapters switch, the base model stays.
        assert HOST.run(residency_counts) == counts
        # The affinity hook: what this process holds, as the worker's claims read it through
        # the registry.
        assert resident_adapters() == {MODEL: frozenset({"film", "noir"})}
        assert h.worker.registry.resident_adapters() == resident_adapters()
        # The usage line of the priced adapter.
        usage = (await h.client.get("/api/v1/usage", headers=h.headers)).json()
        lines = [item["lines"] for item in usage["items"]]
        assert [f"{MODEL} task", "0.01"] in lines[0]
        assert sum([f"{MODEL} LoRA film", "0.002"] in item for item in lines) == 4
    finally:
        await close(h)


async def test_requests_are_checked_at_submit_and_the_adapters_listed(
    made: dict[str, Path], tmp_path: Path
) -> None:
    h = await harness_for(tmp_path, [lora_entry(made)])
    try:
        refused = await h.submit(body(MODEL, "text", loras=[{"name": "sepia"}]))
        assert refused.status_code == 400 and "'sepia'" in refused.text, refused.text
        assert "loras" in refused.text
        too_many = [{"name": name} for name in NAMES]
        refused = await h.submit(body(MODEL, "text", loras=too_many))
        assert refused.status_code == 400 and "loras" in refused.text
        refused = await h.submit(body(MODEL, "text", loras=[{"name": "film", "scale": 2.5}]))
        assert refused.status_code == 400 and "scale" in refused.text
        twice = [{"name": "film"}, {"name": "film", "scale": 0.5}]
        refused = await h.submit(body(MODEL, "text", loras=twice))
        assert refused.status_code == 400 and "twice" in refused.text
        by_url = [{"url": "https://example.com/style.safetensors"}]
        refused = await h.submit(body(MODEL, "text", loras=by_url))
        assert refused.status_code == 400 and "not enabled" in refused.text
        refused = await h.submit(body(MODEL, "text", loras=[{"scale": 1.0}]))
        assert refused.status_code == 400 and "name" in refused.text

        listed = (await h.client.get(f"/api/v1/models/{MODEL}", headers=h.headers)).json()
        offered = {c["name"]: c for c in listed["choices"]["loras"]}
        assert list(offered) == NAMES
        assert offered["film"] == {
            "name": "film",
            "description": "grainy film",
            "scale": 1.0,
            "price_usd": "0.002",
        }
        assert listed["pricing"]["prices_usd"] == {"task": "0.01", "lora:film": "0.002"}
        schema = listed["request_schema"]
        assert schema["properties"]["loras"]["maxItems"] == 4
        choice = schema["$defs"][schema["properties"]["loras"]["items"]["$ref"].split("/")[-1]]
        assert choice["properties"]["name"]["enum"] == NAMES
        assert "url" not in choice["properties"]

        # The console's form: a scale per adapter; the filled ones make the request.
        import httpx

        console = httpx.AsyncClient(transport=h.client._transport, base_url="http://testserver")
        signed_in = await console.post("/console/login", data={"api_key": h.account.api_key})
        assert signed_in.status_code == 303, signed_in.text
        page = await console.get(f"/console/play/{MODEL}")
        assert 'name="loras__film"' in page.text and 'name="loras__pop"' in page.text
        from starlette.datastructures import FormData

        from genhook.console.routes import build_body

        form = FormData([("prompt", "a cat"), ("loras__film", "0.5"), ("loras__ink", "")])
        built = await build_body(listed, form)
        assert built["loras"] == [{"name": "film", "scale": 0.5}]
        await console.aclose()
    finally:
        await close(h)


def test_adapters_are_checked_at_start(made: dict[str, Path], tmp_path: Path) -> None:
    def start(loras: dict[str, Any]) -> str:
        settings = Settings(local_models=[entry(SDXL, made["base"], loras=loras)])
        with pytest.raises(ValueError) as refused:
            load_local_models(settings)
        return str(refused.value)

    missing = tmp_path / "gone"
    said = start({"film": {"path": str(missing)}})
    assert "entry 1 (local/StableDiffusionXLPipeline)" in said and "'film'" in said
    assert str(missing) in said
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_lora_weights.bin").write_bytes(b"\x80\x04")
    said = start({"film": {"path": str(pickled)}})
    assert "only pickle weights: pytorch_lora_weights.bin" in said
    said = start({"film": {"path": str(pickled / "pytorch_lora_weights.bin")}})
    assert "not a .safetensors file" in said
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\xff" * 16)
    said = start({"film": {"path": str(broken)}})
    assert "broken.safetensors" in said and "safetensors header" in said
    said = start({"bad name!": {"path": str(made["film"])}})
    assert "entry 1 (local/StableDiffusionXLPipeline) is invalid" in said and "bad name!" in said
    assert load_local_models(Settings(local_models=[lora_entry(made)]))[0].loras


async def test_adapters_are_unloaded_least_recently_used_first(
    made: dict[str, Path], tmp_path: Path
) -> None:
    """At most ``max_loaded_loras`` per model, and within the device's budget with the
    pipeline: the least recently used adapter goes first, the model stays."""
    h = await harness_for(tmp_path, [lora_entry(made, max_loaded_loras=4)])
    try:

        async def use(*names: str) -> None:
            loras = [{"name": name} for name in names]
            assert (await run_task(h, body(MODEL, "text", loras=loras)))["status"] == "completed"

        await use("film", "noir")
        counts = HOST.run(residency_counts)
        await use("ink")
        await use("oil")
        await use("film")  # film is now the most recently used
        await use("pop")  # five adapters for four places: noir, the least recent, goes
        assert resident_adapters()[MODEL] == {"film", "ink", "oil", "pop"}
        await use("noir", "film")
        assert resident_adapters()[MODEL] == {"film", "oil", "pop", "noir"}
        assert HOST.run(residency_counts) == counts  # the model never reloaded
    finally:
        await close(h)
    # A budget with room for the pipeline and two adapters: the third unloads the oldest.
    from genhook.engines.local._config import check_directory

    model_bytes = weight_bytes(check_directory(made["base"], SDXL), "float32")
    adapter = weight_bytes([made["film"] / "pytorch_lora_weights.safetensors"], "float32")
    budget_gb = (model_bytes + adapter * 2.5) / (1 << 30)
    small = await harness_for(
        tmp_path / "small", [lora_entry(made)], local_models_memory_gb=budget_gb
    )
    try:
        for name in ("film", "noir", "ink"):
            result = await run_task(small, body(MODEL, "text", loras=[{"name": name}]))
            assert result["status"] == "completed", result
        assert resident_adapters()[MODEL] == {"noir", "ink"}
        # Two adapters at once fit; three would not: refused, naming the budget.
        three = [{"name": "film"}, {"name": "noir"}, {"name": "ink"}]
        result = await run_task(small, body(MODEL, "text", loras=three))
        assert result["error_code"] == ErrorCode.ENGINE_OUT_OF_MEMORY, result
        assert "GENHOOK_LOCAL_MODELS_MEMORY_GB" in result["error"]
    finally:
        await close(small)


async def test_a_batch_never_mixes_adapter_sets(made: dict[str, Path], tmp_path: Path) -> None:
    configured = lora_entry(made, max_batch_size=8, max_wait_ms=0)
    h = await harness_for(tmp_path, [configured])
    try:
        calls: list[list[Any]] = []
        engine: Any = h.worker.engine(MODEL)
        generate = engine._generate

        def counted(prepared: list[Any]) -> Any:
            calls.append([item.adapters for item in prepared])
            return generate(prepared)

        engine._generate = counted
        sets: list[list[dict[str, Any]]] = [
            [],
            [{"name": "film"}],
            [],
            [{"name": "film", "scale": 0.5}],
            [{"name": "film"}],
            [{"name": "film", "scale": 0.0}],  # no adapter: the plain tasks' call
        ]
        ids = []
        for seed, loras in enumerate(sets):
            response = await h.submit(body(MODEL, "text", seed=seed, loras=loras))
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])
        await h.run_all()
        assert sorted(len(call) for call in calls) == [1, 2, 3], calls
        for call in calls:
            assert len(set(call)) == 1  # one adapter set per call
        for task_id in ids:
            result = await h.result(task_id)
            assert result["status"] == "completed", result
    finally:
        await close(h)


@pytest.fixture
def file_server(made: dict[str, Path]) -> Iterator[str]:
    """A loopback HTTP server of the film adapter's file and of a file that is not one."""
    film = (made["film"] / "pytorch_lora_weights.safetensors").read_bytes()
    files = {"/film.safetensors": film, "/fake.safetensors": b"\x80\x04pickled" * 8}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = files.get(self.path)
            self.send_response(200 if data else 404)
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


async def test_adapters_by_url_under_the_address_policy(
    made: dict[str, Path], tmp_path: Path, file_server: str
) -> None:
    url = f"{file_server}/film.safetensors"
    # Enabled, but the default policy: a private address is refused, nothing is fetched.
    h = await harness_for(
        tmp_path,
        [lora_entry(made)],
        local_models_lora_urls=True,
        webhook_allow_private_targets=False,
    )
    try:
        listed = (await h.client.get(f"/api/v1/models/{MODEL}", headers=h.headers)).json()
        schema = listed["request_schema"]
        choice = schema["$defs"][schema["properties"]["loras"]["items"]["$ref"].split("/")[-1]]
        assert "url" in choice["properties"]
        refused = await run_task(h, body(MODEL, "text", loras=[{"url": url}]))
        assert refused["error_code"] == ErrorCode.INPUT_ADDRESS_REFUSED, refused
        assert not (tmp_path / "data" / "loras").exists() or not any(
            (tmp_path / "data" / "loras").iterdir()
        )
    finally:
        await close(h)
    # Where private addresses are allowed (a closed network): fetched, kept by its hash,
    # the same picture as the entry's adapter of the same file.
    h = await harness_for(
        tmp_path / "open",
        [lora_entry(made)],
        local_models_lora_urls=True,
        webhook_allow_private_targets=True,
    )
    try:
        named = picture(await run_task(h, body(MODEL, "text", loras=[{"name": "film"}])))
        fetched = await run_task(h, body(MODEL, "text", loras=[{"url": url}]))
        assert picture(fetched) == named
        assert fetched["info"]["loras"] == [{"url": url, "scale": 1.0}]
        cached = list(h.state.settings.data_dir.joinpath("loras").glob("*.safetensors"))
        assert len(cached) == 1 and len(cached[0].stem) == 64
        fake = await run_task(
            h, body(MODEL, "text", loras=[{"url": f"{file_server}/fake.safetensors"}])
        )
        assert fake["error_code"] == ErrorCode.INPUT_UNSUPPORTED_FORMAT, fake
        assert "safetensors" in fake["error"]
    finally:
        await close(h)
