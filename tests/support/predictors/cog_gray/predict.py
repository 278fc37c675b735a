"""A Cog predictor as Cog documents them: unchanged, it runs under genhook and under Cog."""

import tempfile
from collections.abc import Iterator

from cog import BasePredictor, File, Input, Path
from PIL import Image, ImageOps


class Predictor(BasePredictor):
    def setup(self) -> None:
        self.ready = True

    def predict(
        self,
        image: Path = Input(description="a picture"),
        mode: str = Input(default="gray", choices=["gray", "invert"]),
        frames: int = Input(default=2, ge=1, le=5, description="pictures to yield"),
        notes: File | None = Input(default=None, description="an optional text file"),
    ) -> Iterator[Path]:
        picture = Image.open(image).convert("RGB")
        if notes is not None:
            print(notes.read())
        for index in range(frames):
            out = ImageOps.grayscale(picture) if mode == "gray" else ImageOps.invert(picture)
            path = Path(tempfile.mkdtemp()) / f"frame{index}.png"
            out.resize((4 + index, 4 + index)).save(path)
            yield path
