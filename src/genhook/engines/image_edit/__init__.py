"""The built-in image-edit engine (``genhook/image-edit``): classical edits on the CPU.

See ``docs/engines/image-edit.md`` for the vocabulary, the fit policy and the error codes.
"""

from genhook.engines.image_edit._decode import (
    DecodedImage,
    check_pixel_budget,
    decode_image,
)
from genhook.engines.image_edit._detector import Detector
from genhook.engines.image_edit._engine import DetectorEngine, ImageEditEngine
from genhook.engines.image_edit._frames import (
    Decor,
    Looks,
    apply_looks,
    build_decor,
    moderate_inputs,
    read_looks,
)
from genhook.engines.image_edit._moderation import (
    BUILTIN_BLOCKED_TERMS,
    blocked_terms,
    check_prompt,
)
from genhook.engines.image_edit._ops import Context as EditContext
from genhook.engines.image_edit._parser import parse_prompt
from genhook.engines.image_edit._plan import OPERATIONS, EditPlan, FitPolicy, Step
from genhook.media import register_heif

__all__ = [
    "BUILTIN_BLOCKED_TERMS",
    "OPERATIONS",
    "DecodedImage",
    "Decor",
    "Detector",
    "DetectorEngine",
    "EditContext",
    "EditPlan",
    "FitPolicy",
    "ImageEditEngine",
    "Looks",
    "Step",
    "apply_looks",
    "blocked_terms",
    "build_decor",
    "check_pixel_budget",
    "check_prompt",
    "decode_image",
    "moderate_inputs",
    "parse_prompt",
    "read_looks",
    "register_heif",
]
