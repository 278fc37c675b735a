"""The CLI as a newcomer meets it next to ``genhook serve``: credentials found, values whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP
from tests.support.images import data_url
from tests.support.speech import word_error_rate

MODEL = "test/fake-edit"
# Spoken by the text-to-speech model, then transcribed back.
SPOKEN = "Hello from the command line."


def run_cli(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genhook.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def bare_env(service: LiveService, **extra: str) -> dict[str, str]:
    """The user's shell: no key in the environment, a narrow terminal."""
    env = {k: v for k, v in service.env.items() if k not in ("GENHOOK_API_KEY", "GENHOOK_DATA_DIR")}
    env.update(GENHOOK_BASE_URL=service.base_url, COLUMNS="40", **extra)
    return env


def completed_task(service: LiveService) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {service.api_key}"}
    task = HTTP.post(
        f"{service.base_url}/api/v1/model/generateImage",
        json={"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"},
        headers=headers,
        timeout=10,
    ).json()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result: dict[str, Any] = HTTP.get(task["urls"]["get"], headers=headers, timeout=10).json()
        if result["status"] == "completed":
            return result
        time.sleep(0.05)
    raise AssertionError(f"task never completed:\n{service.log()[-3000:]}")


# A plain start's webhook targets: public https only (the tests' default allows loopback).
PLAIN = {"GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "false"}


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One plain ``serve`` for the tests that only read from it, add keys or are refused."""
    service = start_service(tmp_path_factory.mktemp("first-hour"), **PLAIN)
    yield service
    stop_service(service)


def test_cli_finds_the_local_credentials_and_prints_whole_values(
    live_service: LiveService, tmp_path: Path
) -> None:
    result = completed_task(live_service)
    # From the directory `make serve` ran in: ./genhook-data/credentials.json.
    workdir = tmp_path / "checkout"
    (workdir / "genhook-data").mkdir(parents=True)
    shutil.copy(live_service.data_dir / "credentials.json", workdir / "genhook-data")
    shown = run_cli(bare_env(live_service), "result", result["id"], cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    found = (workdir / "genhook-data" / "credentials.json").resolve()
    assert f"using the API key from {found}" in shown.stderr
    # A 40-column terminal neither folds nor cuts the output URL.
    assert any(result["outputs"][0] in line for line in shown.stdout.splitlines()), shown.stdout
    # With GENHOOK_DATA_DIR pointing at the service's data, from anywhere.
    env = bare_env(live_service, GENHOOK_DATA_DIR=str(live_service.data_dir))
    assert run_cli(env, "result", result["id"], cwd=tmp_path).returncode == 0
    # No credentials to find: the service's 401, not a made-up key.
    missing = run_cli(bare_env(live_service), "result", result["id"], cwd=tmp_path)
    assert missing.returncode == 3 and "401" in missing.stderr
    # An explicit key wins and nothing is looked up.
    explicit = run_cli(
        bare_env(live_service, GENHOOK_API_KEY=live_service.api_key), "result", result["id"]
    )
    assert explicit.returncode == 0 and "using the API key" not in explicit.stderr


def test_tables_keep_ids_whole_in_a_narrow_terminal(live_service: LiveService) -> None:
    created = json.loads(live_service.cli("keys", "create", "default", "--json").stdout)
    listed = run_cli({**live_service.env, "COLUMNS": "40"}, "keys", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(created["key_id"] in line for line in listed.stdout.splitlines()), listed.stdout


@pytest.mark.timeout(300)  # a second service beside the module's
def test_serve_dev_accepts_local_webhooks_and_prints_listen(
    tmp_path: Path, live_service: LiveService
) -> None:
    # A shell whose PATH has no genhook: the virtualenv is not active.
    live = start_service(tmp_path, args=("--dev",), PATH="/usr/bin:/bin", **PLAIN)
    try:
        script = Path(sys.executable).parent / "genhook"
        printed = f"  {script} listen --base-url {live.base_url} --port 4242\n"
        assert printed in live.log(), live.log()
        # The printed command runs as printed.
        shown = subprocess.run(
            [str(script), "listen", "--help"], env=live.env, capture_output=True, timeout=60
        )
        assert shown.returncode == 0 and b"--forward-to" in shown.stdout
        # The start's log says the schema was made, in one line and without Alembic's own.
        assert live.log().count("genhook.db.migrate: database schema upgraded from empty") == 1
        assert "alembic" not in live.log()
        response = HTTP.post(
            f"{live.base_url}/api/v1/model/generateImage",
            json={
                "model": MODEL,
                "prompt": "edit",
                "images": [data_url()],
                "size": "1024*1024",
                "webhook_url": "http://127.0.0.1:4242/hook",
            },
            headers={"Authorization": f"Bearer {live.api_key}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
    finally:
        stop_service(live)
    # Without --dev the same request is refused, and the refusal names --dev.
    response = HTTP.post(
        f"{live_service.base_url}/api/v1/model/generateImage",
        json={
            "model": MODEL,
            "prompt": "edit",
            "images": [data_url()],
            "webhook_url": "http://127.0.0.1:4242/hook",
        },
        headers={"Authorization": f"Bearer {live_service.api_key}"},
        timeout=10,
    )
    assert response.status_code == 400
    assert "must use https" in response.json()["message"]
    assert "not a routable public address" in response.json()["message"]
    assert "genhook serve --dev" in response.json()["message"]


def saved_paths(stdout: str) -> list[Path]:
    return [
        Path(line.removeprefix("saved "))
        for line in stdout.splitlines()
        if line.startswith("saved ")
    ]


@pytest.mark.timeout(360)  # the real speech models, through a dozen CLI runs
def test_submit_finds_the_path_takes_files_and_saves_outputs(
    live_service: LiveService, tmp_path: Path
) -> None:
    env = {**bare_env(live_service), "GENHOOK_API_KEY": live_service.api_key, "COLUMNS": "200"}
    # Text to speech without --kind: the catalogue says generateAudio. -o saves the speech.
    spoken = run_cli(
        env,
        "submit",
        "-m",
        "genhook/text-to-speech",
        "-p",
        SPOKEN,
        "--wait",
        "-o",
        str(tmp_path / "tts"),
    )
    assert spoken.returncode == 0, spoken.stdout + spoken.stderr
    [speech] = saved_paths(spoken.stdout)
    assert speech.parent == tmp_path / "tts" and speech.suffix == ".mp3"
    assert speech.read_bytes()[:3] == b"ID3" or speech.read_bytes()[0] == 0xFF

    # Speech to text from that local file, with no prompt: -f audio=FILE sends the file.
    created = run_cli(
        env, "submit", "-m", "genhook/speech-to-text", "-f", f"audio={speech}", "--json"
    )
    assert created.returncode == 0, created.stdout + created.stderr
    task_id = json.loads(created.stdout)["id"]
    # `wait -o` saves the transcript once it ends, then `result -o` saves it again.
    waited = run_cli(env, "wait", task_id, "-o", str(tmp_path / "stt"))
    assert waited.returncode == 0, waited.stdout + waited.stderr
    saved = saved_paths(waited.stdout)
    assert saved and all(p.parent == tmp_path / "stt" and p.name.startswith(task_id) for p in saved)
    transcript = next(p for p in saved if p.suffix == ".json")
    # The speech is sampled anew each time: one misheard word is the model, not the CLI.
    heard = json.loads(transcript.read_text())["text"]
    assert word_error_rate(SPOKEN, heard) <= 0.25, heard
    again = run_cli(env, "result", task_id, "-o", str(tmp_path / "again"), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == task_id  # stdout stays the JSON answer
    assert [p.name for p in saved_paths(again.stderr)] == [p.name for p in saved]

    # --audio FILE is the same request; a missing file is refused before anything is sent.
    direct = run_cli(env, "submit", "-m", "genhook/speech-to-text", "--audio", str(speech))
    assert direct.returncode == 0, direct.stdout + direct.stderr
    missing = run_cli(env, "submit", "-m", "genhook/speech-to-text", "--audio", "nope.mp3")
    assert missing.returncode == 2 and "cannot read nope.mp3" in missing.stderr

    # --kind still overrides, and the service's refusal is printed once.
    wrong = run_cli(env, "submit", "-m", "genhook/text-to-speech", "-p", "hi", "--kind", "image")
    assert wrong.returncode == 3
    assert wrong.stderr.count("not accepted on") == 1, wrong.stderr
    # -o without --wait would have nothing to save yet.
    early = run_cli(env, "submit", "-p", "x", "-i", str(speech), "-o", str(tmp_path / "x"))
    assert early.returncode == 2 and "--output-dir needs --wait" in early.stderr


def test_tasks_help_names_every_status(live_service: LiveService) -> None:
    shown = run_cli({**live_service.env, "COLUMNS": "200"}, "tasks", "--help")
    assert shown.returncode == 0
    for status in ("created", "processing", "completed", "failed", "canceled"):
        assert status in shown.stdout, status


def test_serve_says_where_the_service_console_and_reference_are(
    live_service: LiveService,
) -> None:
    base = live_service.base_url
    expected = (
        f"genhook is ready on {base}\n"
        f"  console:       {base}/console\n"
        f"  API reference: {base}/docs\n"
    )
    # Printed by the API process once it listens; /readyz answering implies it started.
    deadline = time.monotonic() + 30
    while expected not in live_service.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert expected in live_service.log(), live_service.log()[-3000:]
    for path in ("/console", "/docs"):
        assert HTTP.get(base + path, timeout=10, follow_redirects=True).status_code == 200
