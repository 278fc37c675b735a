"""The event stream sends every recorded progress report of a running task as an event of
its own, however many were recorded between two looks (a resumed stream included), each
with the log lines recorded up to it: no step is folded into a later one by the stream."""

from __future__ import annotations

from pathlib import Path

from genhook.tasks.lifecycle import Lifecycle
from genhook.tasks.progress import ProgressRecorder
from genhook.tasks.watch import stream_step
from tests.conftest import make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"


async def test_each_recorded_step_is_an_event(tmp_path: Path) -> None:
    h = await make_harness(make_settings(tmp_path, f"sqlite+aiosqlite:///{tmp_path}/t.db"))
    try:
        body = {"model": MODEL, "prompt": "edit", "images": [data_url()]}
        response = await h.submit(body)
        assert response.status_code == 200, response.text
        task_id = response.json()["id"]
        state = h.state
        claim = await Lifecycle(state.settings, state.db, state.storage).claim("w-1", [MODEL])
        assert [task.id for task in claim.tasks] == [task_id]
        recorder = ProgressRecorder(state.db, task_id, "w-1", interval=60.0)
        for number in range(1, 20):
            recorder.report(progress=number / 19, log=f"step {number}")
            await recorder.flush()  # as the recorder's interval does, once per report here

        first = await stream_step(state.db, task_id, None, state.settings, state.storage)
        assert first is not None
        _, newest, events = first
        assert [view["progress"] for _, view in events] == [1.0]  # the task as it is now
        start = await stream_step(
            state.db, task_id, ("processing", 0), state.settings, state.storage
        )
        assert start is not None
        _, newest, events = start
        assert [view["progress"] for _, view in events] == [round(n / 19, 4) for n in range(1, 20)]
        assert [line["message"] for _, view in events for line in view["logs"]] == [
            f"step {n}" for n in range(1, 20)
        ]
        ids = [event_id for event_id, _ in events]
        assert ids == sorted(set(ids)) and ids[-1] == newest
        # Resumed after the 10th: the 9 others, each once.
        resumed = await stream_step(
            state.db, task_id, ("processing", ids[9]), state.settings, state.storage
        )
        assert resumed is not None
        assert [view["progress"] for _, view in resumed[2]] == [
            round(n / 19, 4) for n in range(11, 20)
        ]
    finally:
        await h.client.aclose()
        await h.state.db.dispose()
