"""JSON log lines: one object per event, the bound task and delivery ids, tracebacks and
``extra=`` fields as fields, uvicorn's loggers through the same handler."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genhook.config import Settings
from genhook.logs import bind_delivery, bind_task, configure_logging, unbind
from genhook.sender.queue import Outgoing


@pytest.fixture
def captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    configure_logging(Settings(data_dir=tmp_path, log_format="json"), role="worker")
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    logging.captureWarnings(False)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_task_bound_line_carries_its_ids(captured: io.StringIO) -> None:
    log = logging.getLogger("genhook.test")
    log.info("before")
    token = bind_task("t1", "acct_1")
    try:
        log.info("working on %s", "it", extra={"step": 3})
    finally:
        unbind(token)
    log.info("after")
    before, working, after = lines(captured)
    assert "task_id" not in before and "task_id" not in after
    assert working["message"] == "working on it"
    assert (working["task_id"], working["account_id"], working["step"]) == ("t1", "acct_1", 3)
    assert (working["role"], working["level"], working["logger"]) == ("worker", "INFO", log.name)
    assert isinstance(working["pid"], int) and working["time"].endswith("+00:00")


async def test_tasks_started_while_bound_inherit_the_ids(captured: io.StringIO) -> None:
    log = logging.getLogger("genhook.test")
    attempt = Outgoing("whd_1", "t2", "acct_2", "https://x", "x.task.terminal", b"", 0, 0, None)

    async def send() -> None:
        await asyncio.sleep(0)
        log.warning("sending")

    token = bind_delivery(attempt)
    try:
        job = asyncio.create_task(send())
    finally:
        unbind(token)
    await job
    (line,) = lines(captured)
    assert (line["delivery_id"], line["task_id"], line["account_id"]) == ("whd_1", "t2", "acct_2")


def test_a_traceback_is_one_field_of_one_line(captured: io.StringIO) -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logging.getLogger("genhook.test").exception("it failed")
    text = captured.getvalue()
    assert text.count("\n") == 1
    (line,) = lines(captured)
    assert "RuntimeError: boom" in line["exc"] and "Traceback" in line["exc"]


def test_uvicorn_lines_are_json_too(captured: io.StringIO) -> None:
    logging.getLogger("uvicorn.error").info("Application startup complete.")
    (line,) = lines(captured)
    assert line["logger"] == "uvicorn.error"


def test_text_format_appends_the_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(Settings(data_dir=tmp_path), role="serve")
        token = bind_task("t3")
        logging.getLogger("genhook.test").info("hello")
        unbind(token)
        logging.getLogger("genhook.test").info("plain")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    first, second = stream.getvalue().splitlines()
    assert first.endswith("genhook.test: hello [task_id=t3]")
    assert second.endswith("genhook.test: plain")


def _restart_error() -> Exception:
    """What SQLAlchemy raises while PostgreSQL restarts: the driver's error wrapped."""
    from sqlalchemy.exc import OperationalError

    try:
        raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    except ConnectionRefusedError as cause:
        return OperationalError("SELECT 1", {}, cause)


def test_an_infrastructure_fault_is_one_line_per_cause_folded(
    captured: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("genhook.logs.time.monotonic", lambda: clock[0])
    log = logging.getLogger("genhook.runtime.roles")
    for _ in range(150):  # a second of a flood
        try:
            raise _restart_error()
        except Exception:
            log.exception("sweep failed; retrying")
        log.warning("task %s: fault (%s); requeued", "t1", OSError(28, "No space left on device"))
        clock[0] += 0.01
    log.warning("an ordinary warning")
    log.warning("an ordinary warning")
    clock[0] += 5
    try:
        raise _restart_error()
    except Exception:
        log.exception("sweep failed; retrying")
    sweeps = [line for line in lines(captured) if line["message"].startswith("sweep failed")]
    assert len(sweeps) == 2
    assert "exc" not in sweeps[0] and "Connect call failed" in sweeps[0]["message"]
    assert "ConnectionRefusedError" in sweeps[0]["message"]
    assert "(149 more like this in the last 5 s)" in sweeps[1]["message"]
    disk = [line for line in lines(captured) if line["message"].startswith("task t1")]
    assert len(disk) == 1 and "No space left on device" in disk[0]["message"]
    log.warning("sweep failed; retrying (%s)", _restart_error())
    assert lines(captured)[-1]["message"].endswith(
        "(ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 5432))"
    )
    # Lines about anything else are never folded, and keep their traceback.
    assert sum(line["message"] == "an ordinary warning" for line in lines(captured)) == 2
    try:
        raise ValueError("a bug")
    except ValueError:
        log.exception("sweep failed; retrying")
    assert "Traceback" in lines(captured)[-1]["exc"]


def test_a_failing_readiness_probe_is_folded(captured: io.StringIO) -> None:
    from genhook.logs import FOLD

    log = logging.getLogger("genhook.api.app")
    for free in range(100):  # probed ten times a second, the reason changing a little
        log.warning("readiness check failed: %s", f"{free} MB free", extra=FOLD)
    assert [line["message"] for line in lines(captured)] == ["readiness check failed: 0 MB free"]


def test_alembic_speaks_only_in_a_debug_log(
    captured: io.StringIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
    logging.getLogger("alembic.runtime.migration").warning("a real problem")
    assert [line["message"] for line in lines(captured)] == ["a real problem"]
    monkeypatch.setattr("sys.stderr", captured)  # the handler of a new configuration
    configure_logging(Settings(data_dir=tmp_path, log_format="json", log_level="DEBUG"))
    try:
        logging.getLogger("alembic.runtime.migration").info("Running upgrade 0009 -> 0010")
    finally:
        logging.getLogger("alembic").setLevel(logging.NOTSET)
    assert lines(captured)[-1]["message"] == "Running upgrade 0009 -> 0010"
