"""The engine end to end on pictures drawn in code; every test asserts on output pixels."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from genhook.engines.edit_request import ALLOWED_SIZES, parse_size
from genhook.engines.image_edit import ImageEditEngine
from genhook.engines.image_edit._plan import OPERATIONS
from genhook.errors import ErrorCode, TaskFailure
from tests.unit.image_edit_fixtures import (
    BLUE,
    GREEN,
    RED,
    YELLOW,
    close,
    encode,
    gradient,
    make_engine,
    mean,
    noise,
    quadrants,
    run,
    solid,
    subject_on_background,
)


@pytest.fixture(scope="module")
def engine() -> Iterator[ImageEditEngine]:
    yield make_engine()


@pytest.fixture(scope="module")
def lenient() -> Iterator[ImageEditEngine]:
    """No NSFW check of inputs: robustness tests spend their time on the edits."""
    yield make_engine(moderation_reject_nsfw_inputs=False)


_COMBINING = {"side_by_side", "stack_vertical", "grid", "overlay", "blend"}


def arr(image: Image.Image) -> np.ndarray:  # type: ignore[type-arg]
    return np.asarray(image.convert("RGB"), dtype=np.int32)


QUADS = encode(quadrants((256, 256)), "PNG")
GRAD = encode(gradient((256, 256)), "PNG")


@pytest.mark.parametrize("size", ALLOWED_SIZES)
def test_output_has_exactly_the_requested_size(engine: ImageEditEngine, size: str) -> None:
    out, result = run(engine, "invert", [QUADS], size=size, output_format="jpeg")
    assert out.size == parse_size(size)
    assert out.format == "JPEG"
    assert result.outputs[0].content_type == "image/jpeg"


def test_png_output_is_png(engine: ImageEditEngine) -> None:
    out, result = run(engine, "invert", [QUADS], output_format="png")
    assert out.format == "PNG" and result.outputs[0].content_type == "image/png"


def test_default_size_is_2048_square() -> None:
    engine = make_engine()
    from genhook.engines.base import EngineJob

    result = engine.run(EngineJob("t", "genhook/image-edit", {"prompt": "invert"}, [QUADS]))
    out = Image.open(io.BytesIO(result.outputs[0].data))
    assert out.size == (2048, 2048) and out.format == "JPEG"


def test_grayscale_has_equal_channels(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "make it black and white", [GRAD])
    a = arr(out)
    assert np.array_equal(a[:, :, 0], a[:, :, 1]) and np.array_equal(a[:, :, 1], a[:, :, 2])
    assert a.std() > 20  # still a picture, not a flat gray


def test_sepia_is_warm(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "sepia", [GRAD])
    a = arr(out)
    assert (a[:, :, 0] >= a[:, :, 1]).mean() > 0.99
    assert (a[:, :, 1] >= a[:, :, 2]).mean() > 0.99


def test_invert_inverts(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "invert the colors", [QUADS])
    assert close(mean(out, (64, 64, 448, 448)), (255 - RED[0], 255 - RED[1], 255 - RED[2]), 4)


@pytest.mark.parametrize(
    ("prompt", "check"),
    [
        ("increase brightness by 50%", lambda a, b: a.mean() > b.mean() * 1.3),
        ("make it darker by 50%", lambda a, b: a.mean() < b.mean() * 0.6),
        ("increase contrast by 80%", lambda a, b: a.std() > b.std() * 1.3),
        ("reduce contrast by 80%", lambda a, b: a.std() < b.std() * 0.4),
        ("desaturate by 100%", lambda a, b: np.abs(a[:, :, 0] - a[:, :, 2]).max() <= 2),
        (
            "boost saturation by 80%",
            lambda a, b: a.std(axis=2).mean() > b.std(axis=2).mean() * 1.2,
        ),
    ],
)
def test_adjustments_move_pixels_the_right_way(
    engine: ImageEditEngine, prompt: str, check: object
) -> None:
    source = encode(gradient((256, 256)).point(lambda v: 60 + v // 2), "PNG")
    before, _ = run(engine, "resize", [source])
    after, _ = run(engine, prompt, [source])
    assert check(arr(after).astype(float), arr(before).astype(float))  # type: ignore[operator]


def _detail(image: Image.Image) -> float:
    a = arr(image).astype(float)
    return float(np.abs(np.diff(a, axis=1)).mean())


def test_blur_and_sharpen_change_detail(engine: ImageEditEngine) -> None:
    texture = encode(noise((1024, 1024)))
    base, _ = run(engine, "resize", [texture])
    blurred, _ = run(engine, "blur it strongly", [texture])
    sharpened, _ = run(engine, "sharpen", [texture])
    softer, _ = run(engine, "reduce sharpness by 100%", [texture])
    assert _detail(blurred) < _detail(base) * 0.7
    assert _detail(sharpened) > _detail(base) * 1.1
    assert _detail(softer) < _detail(base)


def test_rotate_moves_a_marked_corner(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "rotate 90 degrees", [QUADS])
    # Clockwise: red (top left) goes to the top right, blue (bottom left) to the top left.
    assert close(mean(out, (600, 100, 900, 400)), RED)
    assert close(mean(out, (100, 100, 400, 400)), BLUE)
    out, _ = run(engine, "rotate 90 degrees counterclockwise", [QUADS])
    assert close(mean(out, (100, 600, 400, 900)), RED)


def test_rotate_by_an_odd_angle_expands_and_fills(engine: ImageEditEngine) -> None:
    out, result = run(engine, "rotate 45 degrees, letterbox", [encode(solid(GREEN, (256, 256)))])
    assert result.info["fit"]["policy"] == "contain"
    assert close(mean(out, (0, 0, 60, 60)), (0, 0, 0), 5)  # the corner is the fill
    assert close(mean(out, (462, 462, 562, 562)), GREEN, 5)


def test_flips(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "flip horizontally", [QUADS])
    assert close(mean(out, (100, 100, 400, 400)), GREEN)
    out, _ = run(engine, "flip vertically", [QUADS])
    assert close(mean(out, (100, 100, 400, 400)), BLUE)


def test_crop_to_aspect_keeps_the_framing(engine: ImageEditEngine) -> None:
    out, result = run(engine, "crop to 2:1 keeping the top", [QUADS])
    assert result.info["fit"]["policy"] == "contain"
    # A 2:1 strip of the top half letterboxed into a square: black bars above and below.
    assert close(mean(out, (0, 0, 1024, 200)), (0, 0, 0), 5)
    assert close(mean(out, (100, 300, 400, 700)), RED)
    assert close(mean(out, (600, 300, 900, 700)), GREEN)
    assert close(mean(out, (0, 824, 1024, 1024)), (0, 0, 0), 5)


def test_pixelate_makes_flat_blocks(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "pixelate with 64px blocks", [GRAD], output_format="png")
    a = arr(out)
    block = a[64 * 5 + 8 : 64 * 6 - 8, 64 * 5 + 8 : 64 * 6 - 8]
    assert block.std(axis=(0, 1)).max() < 3


def test_posterize_limits_levels(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "posterize to 3 levels, stretch", [GRAD], size="1024*1024")
    values = set(np.unique(arr(out)[:, :, 0]).tolist())
    # Resampling at the fit can blend neighbours at level boundaries, but the levels dominate.
    counts = np.bincount(arr(out)[:, :, 0].ravel(), minlength=256)
    assert counts[[0, 128, 255]].sum() > 0.9 * counts.sum()
    assert len(values) >= 3


def test_edges_are_white_on_black_and_follow_boundaries(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "edge detection", [QUADS])
    a = arr(out)
    assert a[100:400, 100:400].max() < 60  # flat quadrant: no edges
    assert a[:, 500:524].max() > 200  # the vertical boundary is an edge


def test_outline_draws_dark_lines_on_white(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "outline", [QUADS])
    a = arr(out)
    assert a[100:400, 100:400].min() > 200 and a[:, 500:524].min() < 60


def test_pencil_sketch_is_gray_and_light(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "pencil sketch", [QUADS])
    a = arr(out)
    assert np.array_equal(a[:, :, 0], a[:, :, 2])
    assert a.mean() > 180
    assert a[:, 500:524].min() < 150  # a stroke along the boundary


@pytest.mark.parametrize("prompt", ["make it look like a cartoon", "make it look like a painting"])
def test_stylizations_change_the_picture(engine: ImageEditEngine, prompt: str) -> None:
    base, _ = run(engine, "resize", [GRAD])
    out, _ = run(engine, prompt, [GRAD])
    assert np.abs(arr(out) - arr(base)).mean() > 5


def test_vignette_darkens_corners_not_center(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "add a strong vignette", [encode(solid((200, 200, 200), (256, 256)))])
    assert mean(out, (0, 0, 40, 40)).mean() < 120
    assert mean(out, (480, 480, 544, 544)).mean() > 195


def test_border_has_the_named_color_and_the_picture_is_inside(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "add a 50px red border", [encode(solid(BLUE, (256, 256)))])
    a = arr(out)
    assert close(mean(out, (0, 0, 1024, 45)), (255, 0, 0), 2)
    assert close(mean(out, (0, 0, 45, 1024)), (255, 0, 0), 2)
    assert close(mean(out, (979, 0, 1024, 1024)), (255, 0, 0), 2)
    assert close(mean(out, (60, 60, 964, 964)), BLUE, 3)
    assert a.shape[:2] == (1024, 1024)


def test_caption_draws_text_where_asked(engine: ImageEditEngine) -> None:
    plain = encode(solid((20, 20, 20), (256, 256)))
    out, _ = run(engine, 'add the caption "HELLO" at the top in yellow', [plain])
    a = arr(out)
    yellow = (a[:, :, 0] > 200) & (a[:, :, 1] > 200) & (a[:, :, 2] < 80)
    rows = np.flatnonzero(yellow.any(axis=1))
    assert yellow.sum() > 1000
    assert rows.max() < 300  # at the top
    assert not yellow[600:].any()


def test_background_removal_makes_the_surroundings_transparent(engine: ImageEditEngine) -> None:
    out, _ = run(engine, "remove the background", [encode(subject_on_background())])
    assert out.mode == "RGBA"
    alpha = np.asarray(out.getchannel("A"))
    assert alpha[:80, :80].mean() < 10 and alpha[-80:, -80:].mean() < 10
    assert alpha[412:612, 412:612].mean() > 245


def test_background_replacement_and_blur(engine: ImageEditEngine) -> None:
    source = encode(subject_on_background())
    out, _ = run(engine, "replace the background with green", [source])
    assert close(mean(out, (0, 0, 100, 100)), (0, 128, 0), 6)
    assert mean(out, (462, 462, 562, 562))[0] > 180  # the orange subject stays
    base, _ = run(engine, "resize", [source])
    blurred, _ = run(engine, "blur the background", [source])

    def texture(image: Image.Image, box: tuple[int, int, int, int]) -> float:
        return float(arr(image.crop(box)).std(axis=(0, 1)).mean())

    corner, middle = (0, 0, 150, 150), (450, 450, 574, 574)
    assert texture(blurred, corner) < texture(base, corner) * 0.3
    assert texture(blurred, middle) > texture(base, middle) * 0.8


def test_jpeg_output_flattens_transparency_on_white(engine: ImageEditEngine) -> None:
    out, result = run(
        engine, "remove the background", [encode(subject_on_background())], output_format="jpeg"
    )
    assert out.mode == "RGB" and close(mean(out, (0, 0, 80, 80)), (255, 255, 255), 6)
    assert any("white" in note for note in result.info["notes"])


def test_side_by_side_contains_both_inputs(engine: ImageEditEngine) -> None:
    red, blue = encode(solid(RED)), encode(solid(BLUE))
    out, result = run(engine, "put image 2 and image 1 side by side", [red, blue], size="2048*1152")
    assert close(mean(out, (100, 200, 900, 900)), BLUE, 6)
    assert close(mean(out, (1150, 200, 1950, 900)), RED, 6)
    assert result.info["fit"]["policy"] == "contain"


def test_stack_vertical_and_grid(engine: ImageEditEngine) -> None:
    images = [encode(solid(c)) for c in (RED, GREEN, BLUE, YELLOW)]
    out, _ = run(engine, "stack image 1 and image 2 vertically", images[:2], size="1152*2048")
    assert close(mean(out, (100, 100, 1000, 900)), RED, 6)
    assert close(mean(out, (100, 1150, 1000, 1950)), GREEN, 6)
    out, _ = run(engine, "make a 2x2 grid", images)
    assert close(mean(out, (50, 50, 450, 450)), RED, 6)
    assert close(mean(out, (574, 50, 974, 450)), GREEN, 6)
    assert close(mean(out, (50, 574, 450, 974)), BLUE, 6)
    assert close(mean(out, (574, 574, 974, 974)), YELLOW, 6)


def test_several_images_without_a_combination_default_to_side_by_side(
    engine: ImageEditEngine,
) -> None:
    out, result = run(engine, "grayscale", [encode(solid(RED)), encode(solid(BLUE))])
    assert any("side by side" in note for note in result.info["notes"])
    left, right = mean(out, (50, 400, 450, 600)), mean(out, (574, 400, 974, 600))
    assert abs(left[0] - left[2]) < 2 and abs(right[0] - right[2]) < 2
    assert abs(left[0] - right[0]) > 10  # two different grays: both inputs are there


def test_overlay_places_image_two_onto_image_one(engine: ImageEditEngine) -> None:
    base, placed = encode(solid(BLUE, (256, 256))), encode(solid(YELLOW, (64, 64)))
    out, _ = run(engine, "place image 2 onto image 1 at the top right at 25%", [base, placed])
    assert close(mean(out, (760, 40, 980, 250)), YELLOW, 6)
    assert close(mean(out, (40, 40, 400, 400)), BLUE, 6)
    assert close(mean(out, (760, 600, 980, 980)), BLUE, 6)


def test_blend_mixes_by_weight(engine: ImageEditEngine) -> None:
    black, white = encode(solid((0, 0, 0))), encode(solid((255, 255, 255)))
    out, _ = run(engine, "blend image 1 and image 2 at 25%", [black, white])
    assert close(mean(out, (0, 0, 1024, 1024)), (64, 64, 64), 2)


def test_targeted_steps_touch_only_their_image(engine: ImageEditEngine) -> None:
    red, blue = encode(solid(RED)), encode(solid(BLUE))
    out, _ = run(engine, "make image 2 grayscale, then put them side by side", [red, blue])
    assert close(mean(out, (50, 400, 450, 600)), RED, 6)
    right = mean(out, (574, 400, 974, 600))
    assert abs(right[0] - right[2]) < 2


def test_fit_policies(engine: ImageEditEngine) -> None:
    wide = encode(quadrants((512, 256)))
    cover, r1 = run(engine, "invert", [wide])
    contain, r2 = run(engine, "invert, letterbox with white", [wide])
    stretch, r3 = run(engine, "invert, stretch it", [wide])
    assert (r1.info["fit"]["policy"], r2.info["fit"]["policy"], r3.info["fit"]["policy"]) == (
        "cover",
        "contain",
        "stretch",
    )
    # cover crops the sides, so the middle column of quadrant colours fills the frame
    assert not close(mean(cover, (0, 0, 1024, 100)), (255, 255, 255), 10)
    assert close(mean(contain, (0, 0, 1024, 200)), (255, 255, 255), 2)  # padding
    assert close(mean(stretch, (0, 0, 400, 400)), (255 - RED[0], 255 - RED[1], 255 - RED[2]), 6)


def test_info_shows_the_plan(engine: ImageEditEngine) -> None:
    _, result = run(engine, "grayscale, then add a blue border", [QUADS])
    info = result.info
    assert [step["op"] for step in info["plan"]] == ["grayscale", "border"]
    assert info["summary"].startswith("grayscale")
    assert info["fit"]["policy"] == "cover"
    assert info["inputs"] == [{"image": 1, "format": "png", "width": 256, "height": 256}]


def test_every_operation_changes_the_picture(engine: ImageEditEngine) -> None:
    """No operation may hand back an unchanged copy presented as an edit."""
    texture = encode(noise((256, 256)))
    base, _ = run(engine, "resize", [texture], output_format="jpeg")
    skip = {"resize", "blur_faces", "pixelate_faces", "side_by_side", "stack_vertical"}
    skip |= {"grid", "overlay", "blend"}
    for doc in OPERATIONS:
        if doc.name in skip:
            continue
        source = encode(subject_on_background()) if "background" in doc.name else texture
        reference = (
            base if source is texture else run(engine, "resize", [source], output_format="jpeg")[0]
        )
        out, _ = run(engine, doc.example, [source], output_format="jpeg")
        rgba = np.asarray(out.convert("RGBA"), dtype=np.int32)
        moved = np.abs(rgba - np.asarray(reference.convert("RGBA"), dtype=np.int32)).max(axis=2)
        assert (moved > 3).mean() > 0.004, doc.name


def test_engine_errors_are_task_failures(engine: ImageEditEngine) -> None:
    with pytest.raises(TaskFailure) as info:
        run(engine, "grayscale", [b"GIF89a" + b"\x00" * 5])
    assert info.value.code == ErrorCode.INPUT_CORRUPT
    with pytest.raises(TaskFailure) as info:
        run(engine, "grayscale", [QUADS, b"not an image"])
    assert info.value.code == ErrorCode.INPUT_UNSUPPORTED_FORMAT
    assert "image 2" in info.value.message


# The thinnest strip accepted (one side 32 times the other); a thinner one is refused.
@pytest.mark.parametrize("size", [(1, 1), (3, 96)])
def test_every_operation_survives_degenerate_pictures(
    lenient: ImageEditEngine, size: tuple[int, int]
) -> None:
    source = encode(noise(size))
    for doc in OPERATIONS:
        inputs = [source] * (3 if doc.name in _COMBINING else 1)
        try:
            out, _ = run(lenient, doc.example, inputs, output_format="jpeg")
        except TaskFailure as failure:
            # Refusing is fine (no face in noise, no subject to cut out); crashing is not.
            assert failure.code == ErrorCode.INSTRUCTION_INVALID, (doc.name, failure)
        else:
            assert out.size == (1024, 1024), doc.name


def test_a_thinner_strip_is_refused_before_decoding(lenient: ImageEditEngine) -> None:
    with pytest.raises(TaskFailure) as info:
        run(lenient, "grayscale", [encode(noise((3, 700)))])
    assert info.value.code == ErrorCode.INPUT_TOO_COSTLY
    assert "image 1 is 3×700" in info.value.message


def test_letterboxed_cutout_keeps_its_transparency(engine: ImageEditEngine) -> None:
    wide = encode(subject_on_background(320).crop((0, 40, 320, 280)))
    out, result = run(engine, "remove the background, letterbox with red", [wide])
    assert result.info["fit"]["policy"] == "contain"
    rgba = np.asarray(out.convert("RGBA"), dtype=np.int32)
    assert rgba[:100, :, 3].min() == 255 and close(mean(out, (0, 0, 1024, 100)), (255, 0, 0), 2)
    assert rgba[150:250, 0:100, 3].mean() < 10  # cut-out background stays transparent
    assert rgba[462:562, 462:562, 3].mean() > 245


def test_animated_input_is_reported(engine: ImageEditEngine) -> None:
    frames = [solid(color, (64, 64)).convert("P") for color in (RED, GREEN)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=40)
    out, result = run(engine, "invert", [buffer.getvalue()])
    assert result.info["inputs"][0]["animated"] is True
    assert result.info["inputs"][0]["frame_used"] == 1
    assert close(mean(out, (0, 0, 1024, 1024)), (255 - RED[0], 255 - RED[1], 255 - RED[2]), 6)


_PROMPT_PARTS = [doc.example for doc in OPERATIONS] + [
    "letterbox with white",
    "stretch it",
    "make image 2 grayscale",
    "rotate image 1 by 33 degrees",
    'write "x" at the center',
    "add a 4000px border",
    "pixelate with 1px blocks",
    "blur it by 900 px",
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(_PROMPT_PARTS), min_size=1, max_size=4),
    count=st.integers(1, 3),
    fast=st.booleans(),
)
def test_random_plans_give_the_exact_size_or_a_documented_failure(
    lenient: ImageEditEngine, parts: list[str], count: int, fast: bool
) -> None:
    sources = [encode(noise((96 + 40 * i, 64 + 30 * i), seed=i)) for i in range(count)]
    mode = "fast" if fast else "standard"
    try:
        out, _ = run(
            lenient, ", ".join(parts), sources, prompt_optimization_mode=mode, output_format="jpeg"
        )
    except TaskFailure as failure:
        assert failure.code in (ErrorCode.INSTRUCTION_INVALID, ErrorCode.PROMPT_NOT_UNDERSTOOD)
    else:
        assert out.size == (1024, 1024)


@pytest.mark.parametrize(
    ("prompt", "top_color"),
    [("rotate 30 degrees", RED), ("rotate 30 degrees counterclockwise", GREEN)],
)
def test_odd_angle_rotation_turns_the_right_way(
    engine: ImageEditEngine, prompt: str, top_color: tuple[int, int, int]
) -> None:
    out, _ = run(engine, f"{prompt}, letterbox", [encode(quadrants((300, 200)))])
    a = arr(out)
    painted = a.sum(axis=2) > 60
    top = int(np.flatnonzero(painted.any(axis=1))[0]) + 6
    xs = np.flatnonzero(painted[top])
    assert close(a[top, xs].mean(axis=0), top_color, 40)
