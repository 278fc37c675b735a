"""A Server-Sent Events reader for the task event stream (the parts of the format the
service uses: ``id``, ``event``, ``data`` and comment lines)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from genhook.client._models import Prediction, TaskEvent


@dataclass
class SSEDecoder:
    """Feed it lines; it returns an event at each blank line that ends one."""

    _id: str | None = None
    _event: str = "message"
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> TaskEvent | None:
        line = line.rstrip("\r")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> TaskEvent | None:
        if not self._data:
            self._event = "message"
            return None
        try:
            data = json.loads("\n".join(self._data))
        except ValueError:
            data = None
        event_id, event = self._id or "", self._event
        self._data, self._event = [], "message"
        if not isinstance(data, dict):
            return None
        return TaskEvent(id=event_id, event=event, prediction=Prediction.from_json(data))
