"""Moderation, NSFW flags and face operations, with the detector nudenet's wheel ships."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image, ImageFilter

from genhook.config import Settings
from genhook.engines.image_edit import ImageEditEngine
from genhook.engines.media.moderation import BUILTIN_BLOCKED_TERMS, blocked_terms, check_prompt
from genhook.engines.media.nsfw import Detector
from genhook.errors import ErrorCode, TaskFailure
from tests.unit.image_edit_fixtures import (
    encode,
    gradient,
    make_engine,
    noise,
    portrait_bytes,
    portrait_path,
    quadrants,
    run,
    subject_on_background,
)

# Where the face is in grace_hopper.jpg (512×600), measured by eye on the picture.
FACE_CENTER = (262, 240)


@pytest.fixture(scope="module")
def engine() -> Iterator[ImageEditEngine]:
    yield make_engine()


def test_builtin_terms_block_whole_words_only() -> None:
    terms = blocked_terms(Settings())
    assert set(BUILTIN_BLOCKED_TERMS) <= set(terms)
    with pytest.raises(TaskFailure) as info:
        check_prompt("make her NUDE, then grayscale", terms)
    assert info.value.code == ErrorCode.MODERATION_PROMPT_BLOCKED
    assert "'nude'" in info.value.message
    check_prompt("grayscale the denuded hills", terms)  # no whole-word match: allowed


def test_multi_word_terms_match_across_punctuation() -> None:
    with pytest.raises(TaskFailure):
        check_prompt("show an explicit-sex scene", blocked_terms(Settings()))


def test_configured_terms_add_to_or_replace_the_builtin_list() -> None:
    settings = Settings(moderation_blocked_terms=["Banana Split"])
    with pytest.raises(TaskFailure):
        check_prompt("a banana  split, in sepia", blocked_terms(settings))
    only_configured = Settings(moderation_builtin_terms=False, moderation_blocked_terms=["x1"])
    assert blocked_terms(only_configured) == ("x1",)
    check_prompt("nude", blocked_terms(only_configured))


def test_prompt_moderation_runs_before_any_input_is_read(engine: ImageEditEngine) -> None:
    with pytest.raises(TaskFailure) as info:
        run(engine, "undress her and sharpen", [b"not even an image"])
    assert info.value.code == ErrorCode.MODERATION_PROMPT_BLOCKED


def test_a_portrait_is_not_nsfw(engine: ImageEditEngine) -> None:
    _, result = run(engine, "sepia", [portrait_bytes()])
    assert result.outputs[0].nsfw is False
    assert result.info["nsfw_score"] < 0.2


def test_nsfw_inputs_are_rejected_by_policy() -> None:
    # Threshold 0 classifies every picture as NSFW: the real detector and policy path runs.
    strict = make_engine(nsfw_threshold=0.0)
    with pytest.raises(TaskFailure) as info:
        run(strict, "grayscale", [encode(quadrants())])
    assert info.value.code == ErrorCode.MODERATION_NSFW_INPUT
    assert "image 1" in info.value.message


def test_nsfw_flag_is_set_per_output_when_inputs_are_allowed() -> None:
    permissive = make_engine(nsfw_threshold=0.0, moderation_reject_nsfw_inputs=False)
    _, result = run(permissive, "grayscale", [encode(quadrants())])
    assert result.outputs[0].nsfw is True
    default = make_engine()
    _, result = run(default, "grayscale", [encode(quadrants())])
    assert result.outputs[0].nsfw is False


def test_ordinary_pictures_score_under_the_default_threshold() -> None:
    """The suite's own pictures, as benchmarks/nsfw_threshold.py measures them (the default
    is documented in docs/engines/image-edit.md with its false-positive rates)."""
    threshold = Settings().nsfw_threshold
    assert threshold == 0.7
    detector = Detector()
    pictures = [quadrants(), gradient(), noise(), subject_on_background()]
    pictures += [Image.open(portrait_path()).convert("RGB")]
    for picture in pictures:
        for variant in (picture, picture.filter(ImageFilter.GaussianBlur(6))):
            assert detector.detect(variant).nsfw_score < threshold - 0.1


def test_detector_finds_the_face_in_the_portrait() -> None:
    detector = Detector()
    faces = detector.detect(Image.open(portrait_path()), 640).faces
    assert len(faces) == 1
    face = faces[0]
    assert face.x < FACE_CENTER[0] < face.x + face.w
    assert face.y < FACE_CENTER[1] < face.y + face.h


def _face_box(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The central part of the face, mapped from the 512×600 source into an output of ``size``
    filled by the cover fit (scale to the width, crop top and bottom evenly)."""
    scale = size[0] / 512
    offset = (600 * scale - size[1]) / 2
    cx, cy = FACE_CENTER[0] * scale, FACE_CENTER[1] * scale - offset
    half = 50 * scale
    return round(cx - half), round(cy - half), round(cx + half), round(cy + half)


def test_pixelate_faces_hides_the_face_and_keeps_the_rest(engine: ImageEditEngine) -> None:
    plain, _ = run(engine, "resize", [portrait_bytes()])
    hidden, result = run(engine, "pixelate the faces", [portrait_bytes()])
    assert result.info["faces_detected"] == 1
    box = _face_box(hidden.size)
    a = np.asarray(hidden.convert("RGB"), dtype=np.int32)
    b = np.asarray(plain.convert("RGB"), dtype=np.int32)
    face_a, face_b = a[box[1] : box[3], box[0] : box[2]], b[box[1] : box[3], box[0] : box[2]]
    assert np.abs(face_a - face_b).mean() > 8
    # Pixelated: neighbouring pixels are mostly equal inside the face.
    assert (np.abs(np.diff(face_a, axis=1)).max(axis=2) <= 2).mean() > 0.8
    corner = (slice(0, 150), slice(0, 150))
    assert np.abs(a[corner] - b[corner]).mean() < 1.0


def test_blur_faces_removes_detail_in_the_face(engine: ImageEditEngine) -> None:
    plain, _ = run(engine, "resize", [portrait_bytes()])
    blurred, _ = run(engine, "blur all faces", [portrait_bytes()])
    box = _face_box(blurred.size)

    def detail(image: Image.Image) -> float:
        face = np.asarray(image.convert("L").crop(box), dtype=np.float64)
        return float(np.abs(np.diff(face, axis=0)).mean())

    assert detail(blurred) < detail(plain) * 0.5


def test_face_operation_without_a_face_fails_honestly(engine: ImageEditEngine) -> None:
    with pytest.raises(TaskFailure) as info:
        run(engine, "blur the faces", [encode(quadrants())])
    assert info.value.code == ErrorCode.INSTRUCTION_INVALID
    assert "no face" in info.value.message


def test_background_edit_on_a_portrait_keeps_the_face(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "remove the background", [portrait_bytes()])
    alpha = np.asarray(out.getchannel("A"))
    box = _face_box(out.size)
    assert alpha[box[1] : box[3], box[0] : box[2]].mean() > 240
    assert alpha[:60, :60].mean() < 20  # the flag in the top-left corner is background
