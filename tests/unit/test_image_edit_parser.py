"""Prompt -> edit plan: vocabulary, order, parameters, image references, failures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genhook.engines.image_edit import OPERATIONS, parse_prompt
from genhook.engines.image_edit._plan import OPERATION_NAMES
from genhook.errors import ErrorCode, TaskFailure


def ops(prompt: str, images: int = 1, loose: bool = False) -> list[str]:
    return [step.op for step in parse_prompt(prompt, images, loose=loose).steps]


@pytest.mark.parametrize("doc", OPERATIONS, ids=lambda d: d.name)
def test_every_documented_example_parses_to_its_operation(doc: object) -> None:
    name, example = doc.name, doc.example  # type: ignore[attr-defined]
    images = 3 if name in {"side_by_side", "stack_vertical", "grid", "overlay", "blend"} else 1
    assert name in ops(example, images), example


def test_order_follows_the_prompt_across_separators() -> None:
    prompt = "grayscale, then rotate 90 degrees; flip horizontally and add a red border"
    assert ops(prompt) == ["grayscale", "rotate", "flip", "border"]


def test_several_operations_in_one_clause_keep_their_order() -> None:
    assert ops("make it grayscale with a thick gray border") == ["grayscale", "border"]


def test_black_and_white_is_not_split_on_and() -> None:
    plan = parse_prompt("make it black and white and blur it", 1, loose=False)
    assert [s.op for s in plan.steps] == ["grayscale", "blur"]
    assert plan.ignored == []


@pytest.mark.parametrize(
    ("prompt", "factor"),
    [
        ("increase brightness by 20%", 1.2),
        ("make it darker by 30%", 0.7),
        ("reduce contrast by 50 percent", 0.5),
        ("set saturation to 150%", 1.5),
        ("desaturate by 40%", 0.6),
        ("lower sharpness by 25%", 0.75),
        ("brighten it slightly", 1.1),
        ("boost saturation a lot", 1.5),
        ("make it brighter", 1.25),
    ],
)
def test_adjustment_direction_and_amount(prompt: str, factor: float) -> None:
    (step,) = parse_prompt(prompt, 1, loose=False).steps
    assert step.params["factor"] == pytest.approx(factor)


def test_adjustment_percent_stays_with_its_property() -> None:
    steps = parse_prompt("increase brightness by 20% and contrast by 10%", 1, loose=False).steps
    assert [(s.op, s.params["factor"]) for s in steps] == [
        ("brightness", pytest.approx(1.2)),
        ("contrast", pytest.approx(1.1)),
    ]


@pytest.mark.parametrize(
    ("prompt", "degrees"),
    [
        ("rotate 90 degrees", 90.0),
        ("rotate by 45° counterclockwise", -45.0),
        ("rotate left", -90.0),
        ("rotate it 30 degrees to the right", 30.0),
        ("turn it upside down", 180.0),
        ("rotate 270 degrees", -90.0),
    ],
)
def test_rotation_angles_are_clockwise_degrees(prompt: str, degrees: float) -> None:
    (step,) = parse_prompt(prompt, 1, loose=False).steps
    assert step.op == "rotate"
    assert step.params["degrees_clockwise"] == pytest.approx(degrees)


def test_turn_into_is_not_a_rotation() -> None:
    assert ops("turn it into a painting") == ["painting"]


def test_flip_axes() -> None:
    assert parse_prompt("flip vertically", 1, loose=False).steps[0].params == {"axis": "vertical"}
    assert parse_prompt("mirror it", 1, loose=False).steps[0].params == {"axis": "horizontal"}


def test_crop_aspect_and_anchor() -> None:
    (step,) = parse_prompt("crop to 16:9 keeping the top", 1, loose=False).steps
    assert step.params == {"aspect": "16:9", "anchor": "top"}
    assert parse_prompt("make it square", 1, loose=False).steps[0].params["aspect"] == "1:1"


def test_crop_without_ratio_is_an_invalid_instruction() -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt("crop it", 1, loose=False)
    assert info.value.code == ErrorCode.INSTRUCTION_INVALID
    assert "aspect ratio" in info.value.message


def test_caption_keeps_quoted_text_verbatim_with_commas_and_and() -> None:
    (step,) = parse_prompt(
        'add the caption "Fish, Chips and Peas" at the top left in yellow', 1, loose=False
    ).steps
    assert step.params == {
        "text": "Fish, Chips and Peas",
        "position": "top-left",
        "color": "#ffff00",
        "size": "medium",
    }


def test_border_color_width_and_named_colors() -> None:
    (step,) = parse_prompt("add a 40px light blue frame", 1, loose=False).steps
    assert step.params == {"color": "#add8e6", "width_px": 40.0}


@pytest.mark.parametrize(
    ("prompt", "op"),
    [
        ("remove the background", "remove_background"),
        ("make the background transparent", "remove_background"),
        ("blur the background", "blur_background"),
        ("replace the background with green", "color_background"),
        ("blur all faces", "blur_faces"),
        ("pixelate the faces", "pixelate_faces"),
        ("blur it", "blur"),
        ("pixelate it", "pixelate"),
    ],
)
def test_specific_phrases_win_over_general_ones(prompt: str, op: str) -> None:
    assert ops(prompt) == [op]


def test_image_references_resolve_to_request_order() -> None:
    plan = parse_prompt(
        "make the second image sepia, then put image 1 and image 2 side by side", 2, loose=False
    )
    assert [(s.op, s.targets) for s in plan.steps] == [("sepia", (1,)), ("side_by_side", (0, 1))]


def test_overlay_reads_placed_and_base_images() -> None:
    (step,) = parse_prompt(
        "place image 2 onto image 1 at the bottom right at 25%", 2, loose=False
    ).steps
    assert step.op == "overlay"
    assert step.targets == (1, 0)
    assert step.params == {"position": "bottom-right", "scale_percent": 25.0}


def test_image_lists_with_commas_stay_one_instruction() -> None:
    (step,) = parse_prompt("images 1, 2 and 3 in a grid with 3 columns", 3, loose=False).steps
    assert step.op == "grid"
    assert step.targets == (0, 1, 2)
    assert step.params == {"columns": 3}


def test_reference_to_a_missing_image_is_invalid() -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt("make image 3 grayscale", 2, loose=False)
    assert info.value.code == ErrorCode.INSTRUCTION_INVALID
    assert "image 3" in info.value.message


def test_combining_one_image_is_invalid() -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt("put them side by side", 1, loose=False)
    assert info.value.code == ErrorCode.INSTRUCTION_INVALID


def test_nothing_understood_lists_every_supported_operation() -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt("make it look expensive", 1, loose=False)
    assert info.value.code == ErrorCode.PROMPT_NOT_UNDERSTOOD
    for name in OPERATION_NAMES:
        assert name in info.value.message


def test_unrecognized_clauses_are_reported_not_dropped_silently() -> None:
    plan = parse_prompt("grayscale and make it look expensive", 1, loose=False)
    assert [s.op for s in plan.steps] == ["grayscale"]
    assert plan.ignored == ["make it look expensive"]


def test_fit_instruction_alone_is_no_edit() -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt("letterbox it", 1, loose=False)
    assert info.value.code == ErrorCode.PROMPT_NOT_UNDERSTOOD
    assert "resize" in info.value.message


def test_fit_policy_words() -> None:
    assert parse_prompt("grayscale, letterbox with white", 1, loose=False).fit.mode == "contain"
    assert (
        parse_prompt("grayscale, letterbox with white", 1, loose=False).fit.pad_color == "#ffffff"
    )
    assert parse_prompt("sepia and stretch it", 1, loose=False).fit.mode == "stretch"


@pytest.mark.parametrize(
    ("prompt", "op"),
    [
        ("give it a vintage look", "sepia"),
        ("make it grayscle", "grayscale"),
        ("make the colors more vivid", "saturation"),
        ("anonymize everyone", "pixelate_faces"),
        ("comic book style", "cartoon"),
        ("posterzie it", "posterize"),
    ],
)
def test_thinking_widens_interpretation_and_says_so(prompt: str, op: str) -> None:
    with pytest.raises(TaskFailure) as info:
        parse_prompt(prompt, 1, loose=False)
    assert info.value.code == ErrorCode.PROMPT_NOT_UNDERSTOOD
    plan = parse_prompt(prompt, 1, loose=True)
    assert [s.op for s in plan.steps] == [op]
    assert plan.interpretations, "a loose reading must be reported"


def test_describe_is_plain_json_with_one_based_images() -> None:
    plan = parse_prompt("make image 2 grayscale, then blend image 1 and image 2", 2, loose=False)
    described = plan.describe()
    assert described[0] == {"op": "grayscale", "images": [2], "from": "make image 2 grayscale"}
    assert described[1]["op"] == "blend"
    assert "grayscale" in plan.summary() and "blend" in plan.summary()


_WORDS = [
    "rotate",
    "90",
    "degrees",
    "left",
    "crop",
    "to",
    "16:9",
    "image",
    "2",
    "and",
    "then",
    ",",
    "blur",
    "the",
    "background",
    "faces",
    "side",
    "by",
    "grid",
    "border",
    "red",
    "20%",
    "px",
    "caption",
    '"hi, and"',
    "brightness",
    "increase",
    "flip",
    "vertically",
    "grayscale",
    "black",
    "white",
    "blend",
    "onto",
    "image 1",
    "posterize",
    "levels",
    "0",
    "999",
    "-5",
    "letterbox",
    "stretch",
    "vintage",
    "pixelate",
    "blocks",
    "'",
    '"',
    "%",
    "°",
    "second",
]


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.sampled_from(_WORDS), max_size=30),
    images=st.integers(1, 4),
    loose=st.booleans(),
)
def test_any_prompt_parses_or_fails_with_a_documented_code(
    words: list[str], images: int, loose: bool
) -> None:
    try:
        plan = parse_prompt(" ".join(words) or "?", images, loose=loose)
    except TaskFailure as failure:
        assert failure.code in (ErrorCode.PROMPT_NOT_UNDERSTOOD, ErrorCode.INSTRUCTION_INVALID)
    else:
        assert plan.steps
        for step in plan.steps:
            assert all(0 <= t < images for t in step.targets)
            assert json.loads(json.dumps(step.describe())) == step.describe()


@pytest.mark.parametrize(
    ("prompt", "ignored"),
    [
        ("make it warmer and increase contrast", ["make it warmer"]),
        ("increase contrast and make it warmer", ["make it warmer"]),
        ("make it brighter and warmer", ["warmer"]),
        ("sharpen it with lots of dragons", ["dragons"]),
        ("increase brightness by 20% and add sparkles", ["add sparkles"]),
        ("in the style of van gogh, then sharpen it", ["in the style of van gogh"]),
        # Words an operation read (amounts, units, positions, directions) are no leftovers.
        ("blur it by 6 px", []),
        ("posterize to 4 levels", []),
        ("rotate it 90 degrees clockwise", []),
        ("make a 2x2 grid", []),
        ("put image 1 and image 2 side by side", []),
        ('add the caption "Hello" at the top in yellow', []),
    ],
)
def test_every_part_of_a_prompt_is_an_operation_or_ignored(prompt: str, ignored: list[str]) -> None:
    for loose in (False, True):
        plan = parse_prompt(prompt, 3, loose=loose)
        assert plan.steps
        assert plan.ignored == ignored, (prompt, loose)


@pytest.mark.parametrize(
    ("prompt", "text", "where"),
    [
        ("add the text Hello World at the bottom", "Hello World", "bottom-center"),
        ("write Hello World on top", "Hello World", "top-center"),
        ("put the words Big Sale on top", "Big Sale", "top-center"),
        ("Write Happy Birthday in red at the top", "Happy Birthday", "top-center"),
        ("add the title Summer Trip to the bottom left in white", "Summer Trip", "bottom-left"),
        ("write: Open 24/7", "Open 24/7", "bottom-center"),
    ],
)
def test_unquoted_caption_text_keeps_its_case(prompt: str, text: str, where: str) -> None:
    for loose in (False, True):
        plan = parse_prompt(prompt, 1, loose=loose)
        assert [(s.op, s.params["text"], s.params["position"]) for s in plan.steps] == [
            ("caption", text, where)
        ]
        assert plan.ignored == []


def test_a_caption_keeps_the_rest_of_the_prompt() -> None:
    plan = parse_prompt(
        "write Happy Birthday in red at the top and add a gold border", 1, loose=False
    )
    assert [s.op for s in plan.steps] == ["caption", "border"]
    assert plan.steps[0].params["color"] == "#ff0000"
    # "add" alone is no caption: a border stays a border, a caption with no text is none.
    assert ops("add a red border") == ["border"]
    with pytest.raises(TaskFailure):
        parse_prompt("add the caption at the top", 1, loose=False)


@pytest.mark.parametrize(
    ("prompt", "style"),
    [
        ("in the style of a mosaic", "mosaic"),
        ("make it mosaic style", "mosaic"),
        ("apply the style of a woodcut", "woodcut"),
        ("styled like an etching", "etching"),
        ("style: swirl", "swirl"),
    ],
)
def test_named_styles(prompt: str, style: str) -> None:
    for loose in (False, True):  # "mosaic" alone still reads as pixelate when loose
        plan = parse_prompt(prompt, 1, loose=loose)
        assert [(s.op, s.params) for s in plan.steps] == [("style_transfer", {"style": style})]
        assert plan.style_sources == frozenset()
    assert ops("make it a mosaic", loose=True) == ["pixelate"]


def test_another_image_lends_its_style() -> None:
    plan = parse_prompt("in the style of the second image", 2, loose=False)
    (step,) = plan.steps
    assert step.params == {"style": "image 2", "style_image": 2} and step.targets == ()
    assert plan.style_sources == frozenset({1})
    # The image named after "style of" is the style, wherever the other one is named.
    for prompt in (
        "apply the style of image 2 to image 1",
        "restyle image 1 in the style of image 2",
    ):
        (step,) = parse_prompt(prompt, 2, loose=False).steps
        assert (step.params["style_image"], step.targets) == (2, (0,)), prompt
    with pytest.raises(TaskFailure) as info:
        parse_prompt("in the style of the second image", 1, loose=False)
    assert info.value.code == ErrorCode.INSTRUCTION_INVALID
    (step,) = parse_prompt("make image 1 look like image 2", 2, loose=False).steps
    assert (step.op, step.params["style_image"], step.targets) == ("style_transfer", 2, (0,))
    # "look like" a known operation stays that operation.
    assert ops("make it look like a painting") == ["painting"]
    assert ops("make image 2 look like a painting", 2) == ["painting"]
