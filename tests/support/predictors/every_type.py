"""A model that takes every input type and returns every output type, so the tests see
each one cross the wire both ways."""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from PIL import Image

from genhook.model import Input, Model, Output, Stopped


class EveryType(Model):
    """Echoes its inputs: each picture's size, each file's bytes."""

    price_usd = "0.002"
    deadline_seconds = 120.0

    def setup(self) -> None:
        self.setups = getattr(self, "setups", 0) + 1

    def predict(
        self,
        text: str = Input(description="any text", max_length=40),
        count: int = Input(3, ge=1, le=10),
        scale: float = Input(0.5, ge=0.0, le=1.0),
        flag: bool = False,
        mode: Literal["fast", "slow"] = "fast",
        flavour: str = Input("plain", choices=["plain", "spicy"]),
        image: Image.Image | None = None,
        pictures: list[Image.Image] = Input([], max_length=3),
        document: Path | None = None,
        tags: list[str] = Input([], max_length=4),
    ) -> list[Any]:
        outputs: list[Any] = [
            {
                "text": text,
                "count": count,
                "scale": scale,
                "flag": flag,
                "mode": mode,
                "flavour": flavour,
                "tags": tags,
                "image": None if image is None else [*image.size, image.mode],
                "pictures": [list(p.size) for p in pictures],
                "thread": threading.current_thread().name,
            }
        ]
        if image is not None:
            outputs.append(image.resize((8, 8)))
        if document is not None:
            outputs[0]["document"] = {
                "suffix": document.suffix,
                "sha256": hashlib.sha256(document.read_bytes()).hexdigest(),
            }
            copy = Path(tempfile.mkdtemp()) / f"copy{document.suffix}"
            copy.write_bytes(document.read_bytes())
            outputs.append(copy)
        outputs.append(f"{text} x{count}")
        return outputs


class Speak(Model):
    """Returns bytes of a declared type."""

    def predict(self, text: str) -> Annotated[bytes, Output("text/plain")]:
        return text.encode()[::-1]


class Numbers(Model):
    """Reports progress each step; stops when told."""

    def setup(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.stopped = False

    def predict(self, steps: int = Input(4, ge=1, le=1000)) -> dict[str, Any]:
        self.started.set()
        try:
            for step in range(steps):
                self.release.wait(30)
                time.sleep(0.01)
                self.progress((step + 1) / steps, f"step {step + 1}/{steps}")
        except Stopped:
            self.stopped = True
            raise
        return {"steps": steps}


class Doubler(Model):
    """Batched: one call doubles many numbers; a negative one fails alone."""

    def setup(self) -> None:
        self.calls: list[int] = []

    def predict(self, value: int) -> dict[str, Any]:
        return self.predict_batch([{"value": value}])[0]

    def predict_batch(self, items: list[dict[str, Any]]) -> list[Any]:
        self.calls.append(len(items))
        return [
            ValueError("negative")
            if item["value"] < 0
            else {"double": 2 * item["value"], "batch": len(items)}
            for item in items
        ]


class Broken(Model):
    def predict(self, value: int) -> str:
        raise RuntimeError(f"cannot handle {value}")
