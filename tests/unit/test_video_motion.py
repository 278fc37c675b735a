"""Reading motion from a video prompt, and what is left for the edit parser's looks."""

from __future__ import annotations

import pytest

from genhook.engines.image_edit import read_looks
from genhook.engines.image_to_video._motion import parse_motion
from genhook.engines.video_request import frame_size, nearest_aspect_ratio


@pytest.mark.parametrize(
    ("prompt", "ops"),
    [
        ("zoom in slowly", ["zoom_in"]),
        ("Ken Burns effect", ["zoom_in"]),
        ("pull back to reveal the room", ["zoom_out"]),
        ("pan to the right", ["pan"]),
        ("tilt up, then fade out", ["pan", "fade_out"]),
        ("rotate 30 degrees counterclockwise", ["rotate"]),
        ("handheld shaky camera", ["shake"]),
        ("fade in and out", ["fade_in_out"]),
        ("fade from black", ["fade_in"]),
        ("crossfade between the photos", ["transition"]),
        ("hard cuts", ["transition"]),
    ],
)
def test_motion_phrases(prompt: str, ops: list[str]) -> None:
    assert [move.op for move in parse_motion(prompt).moves] == ops


def test_looks_are_left_for_the_edit_parser() -> None:
    motion = parse_motion('slowly zoom in, then make it black and white and add the caption "Hi"')
    assert motion.zoom == "in"
    assert motion.rest == 'make it black and white and add the caption "Hi"'
    looks = read_looks(motion.rest, 1)
    assert [step.op for step in looks.per_image] == ["grayscale"]
    assert [step.op for step in looks.finishing] == ["caption"]


def test_edit_words_are_not_taken_for_motion() -> None:
    motion = parse_motion("cut out the subject, turn it into a pencil sketch")
    assert motion.moves == [] and not motion.camera_moves
    assert motion.rest == "cut out the subject, turn it into a pencil sketch"


def test_rotation_direction_and_cap() -> None:
    motion = parse_motion("spin 720 degrees anticlockwise")
    assert motion.rotate_degrees == -360.0
    assert motion.notes
    assert parse_motion("rotate").rotate_degrees == 12.0


def test_text_with_no_look_gives_no_looks_not_a_failure() -> None:
    looks = read_looks("something lovely", 1)
    assert looks.plan is None and looks.ignored == ["something lovely"]


def test_frame_sizes_are_even_with_the_resolution_as_short_side() -> None:
    assert frame_size("720p", "16:9") == (1280, 720)
    assert frame_size("1080p", "9:16") == (1080, 1920)
    assert frame_size("480p", "16:9") == (854, 480)
    assert frame_size("480p", "3:4") == (480, 640)
    assert nearest_aspect_ratio(4000, 3000) == "4:3"
    assert nearest_aspect_ratio(1000, 1900) == "9:16"
