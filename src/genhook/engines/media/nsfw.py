"""NSFW and face detection with the YOLOv8 model that the ``nudenet`` wheel ships.

One ONNX Runtime session per worker process, on the CPU, pinned to one thread because the
service scales by worker processes. The same pass yields an NSFW score and face boxes
(the model has ``FACE_FEMALE`` and ``FACE_MALE`` classes), so no second model is needed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
from PIL import Image

from genhook.config import Settings
from genhook.engines.base import EngineJob, EngineResult
from genhook.engines.media.decode import DecodedImage
from genhook.engines.media.moderation import blocked_terms
from genhook.engines.onnx import cpu_session
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import register_heif

# Class order of nudenet's 320n.onnx (nudenet 3.4).
LABELS: tuple[str, ...] = (
    "FEMALE_GENITALIA_COVERED",
    "FACE_FEMALE",
    "BUTTOCKS_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_BREAST_EXPOSED",
    "ANUS_EXPOSED",
    "FEET_EXPOSED",
    "BELLY_COVERED",
    "FEET_COVERED",
    "ARMPITS_COVERED",
    "ARMPITS_EXPOSED",
    "FACE_MALE",
    "BELLY_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "ANUS_COVERED",
    "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
)
# Classes that make a picture NSFW; covered body parts, faces, feet, bellies do not.
NSFW_LABELS = frozenset(
    {
        "FEMALE_GENITALIA_EXPOSED",
        "FEMALE_BREAST_EXPOSED",
        "MALE_GENITALIA_EXPOSED",
        "BUTTOCKS_EXPOSED",
        "ANUS_EXPOSED",
    }
)
FACE_LABELS = frozenset({"FACE_FEMALE", "FACE_MALE"})
_NSFW_COLUMNS = [LABELS.index(label) for label in sorted(NSFW_LABELS)]
_FACE_COLUMNS = [LABELS.index(label) for label in sorted(FACE_LABELS)]
FACE_MIN_SCORE = 0.25
_NMS_IOU = 0.45

Array = npt.NDArray[Any]


@dataclass(frozen=True, slots=True)
class Box:
    x: int
    y: int
    w: int
    h: int
    score: float


@dataclass(frozen=True, slots=True)
class Detection:
    nsfw_score: float  # highest confidence of any exposed-body class anywhere in the picture
    faces: list[Box]


def model_path() -> Path:
    import nudenet

    return Path(nudenet.__file__).with_name("320n.onnx")


class Detector:
    def __init__(self, threads: int = 1) -> None:
        self._session = cpu_session(model_path(), threads)
        self._input = self._session.get_inputs()[0].name

    def detect(self, image: Image.Image, resolution: int = 320) -> Detection:
        """Run the model on a picture (alpha ignored); boxes are in its pixel coordinates.

        The picture is letterboxed into a ``resolution`` square (padding right and bottom,
        as the model was trained); Pillow's reducing resize keeps this cheap on big outputs.
        """
        width, height = image.size
        side = max(height, width)
        scale_in = resolution / side
        small = image.convert("RGB") if image.mode != "RGB" else image
        small = small.resize(
            (max(1, round(width * scale_in)), max(1, round(height * scale_in))),
            Image.Resampling.BILINEAR,
            reducing_gap=2.0,
        )
        blob = np.zeros((resolution, resolution, 3), dtype=np.uint8)
        blob[: small.height, : small.width] = np.asarray(small)
        tensor = np.ascontiguousarray(blob.transpose(2, 0, 1)[np.newaxis], dtype=np.float32)
        tensor /= 255.0
        # A session is thread-safe: threads that share the detector (a batch's pictures, a
        # model's concurrent calls) each run on their own thread, one core each.
        output = self._session.run(None, {self._input: tensor})[0]
        rows = np.asarray(output)[0].T  # (anchors, 4 + classes)
        scores = rows[:, 4:]
        nsfw = float(scores[:, _NSFW_COLUMNS].max()) if len(rows) else 0.0
        face_scores = scores[:, _FACE_COLUMNS].max(axis=1) if len(rows) else np.zeros(0)
        keep = np.flatnonzero(face_scores >= FACE_MIN_SCORE)
        faces: list[Box] = []
        if keep.size:
            scale = side / resolution
            cx, cy, bw, bh = (rows[keep, i] * scale for i in range(4))
            boxes = np.stack([cx - bw / 2, cy - bh / 2, bw, bh], axis=1)
            picked = cv2.dnn.NMSBoxes(
                boxes.tolist(), face_scores[keep].tolist(), FACE_MIN_SCORE, _NMS_IOU
            )
            for index in np.asarray(picked).reshape(-1):
                x, y, w, h = boxes[int(index)]
                x0, y0 = max(0, int(x)), max(0, int(y))
                x1, y1 = min(width, int(x + w)), min(height, int(y + h))
                if x1 > x0 and y1 > y0:
                    faces.append(
                        Box(x0, y0, x1 - x0, y1 - y0, float(face_scores[keep][int(index)]))
                    )
        return Detection(nsfw_score=nsfw, faces=faces)


def moderate_inputs(
    detector: Detector, decoded: list[DecodedImage], threshold: float, first_number: int = 1
) -> None:
    """Refuse the task when an input picture is classified NSFW (the moderation policy)."""
    for number, item in enumerate(decoded, start=first_number):
        score = detector.detect(item.image, 320).nsfw_score
        if score >= threshold:
            raise TaskFailure(
                ErrorCode.MODERATION_NSFW_INPUT,
                f"image {number} was classified NSFW (score {score:.2f}, threshold "
                f"{threshold:.2f}); the moderation policy rejects NSFW inputs",
            )


class DetectorEngine:
    """The shell of the built-in picture engines: settings, prompt terms, one NSFW detector
    per process, and ``run`` turning surprises into a generic engine failure (logged under
    the engine's own module)."""

    # Named in the generic failure message: "the image engine failed unexpectedly".
    kind = "image"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._terms = blocked_terms(settings)
        self._detector: Detector | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the detector once per process and pin native thread pools to one thread
        (unless ``detector_threads`` says otherwise): the service scales by worker
        processes, and oversubscribed cores scale worse."""
        with self._lock:
            if self._detector is not None:
                return
            register_heif()
            cv2.setNumThreads(1)
            self._detector = Detector(threads=self.detector_threads())

    def detector_threads(self) -> int:
        """The detector's intra-op threads; an engine whose pictures take turns with a
        computation on the process's cores may give it that share."""
        return 1

    @property
    def detector(self) -> Detector:
        if self._detector is None:
            self.load()
        assert self._detector is not None
        return self._detector

    def run(self, job: EngineJob) -> EngineResult:
        # Lines under the logger of the engine that ran (a local model's, not this module's).
        engine_log = logging.getLogger(type(self).__module__)
        try:
            return self._run(job)
        except TaskFailure as failure:
            if job.stop.is_set():  # given up (a cancel, say): the worker says why
                engine_log.debug("task %s: stopped, as asked", job.task_id)
            else:
                engine_log.info("task %s failed: %s", job.task_id, failure)
            raise
        except Exception as exc:
            engine_log.exception("task %s: %s engine error", job.task_id, self.kind)
            raise TaskFailure(
                ErrorCode.ENGINE_ERROR,
                f"the {self.kind} engine failed unexpectedly ({type(exc).__name__})",
            ) from exc

    def _run(self, job: EngineJob) -> EngineResult:
        raise TaskFailure(ErrorCode.ENGINE_ERROR, f"{type(self).__name__} runs no jobs")
