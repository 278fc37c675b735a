"""The built-in image-edit engine (``genhook/image-edit``): classical edits on the CPU.

See ``docs/engines/image-edit.md`` for the vocabulary, the fit policy and the error codes.
What it shares with the other picture engines (decoding, the NSFW detector, prompt
moderation, output fitting and encoding) is ``genhook.engines.media``.
"""

from genhook.engines.image_edit._engine import EditingEngine, ImageEditEngine
from genhook.engines.image_edit._frames import (
    Decor,
    Looks,
    apply_looks,
    build_decor,
    read_looks,
)
from genhook.engines.image_edit._ops import Context as EditContext
from genhook.engines.image_edit._parser import parse_prompt
from genhook.engines.image_edit._plan import OPERATIONS, EditPlan, FitPolicy, Step

__all__ = [
    "OPERATIONS",
    "Decor",
    "EditContext",
    "EditPlan",
    "EditingEngine",
    "FitPolicy",
    "ImageEditEngine",
    "Looks",
    "Step",
    "apply_looks",
    "build_decor",
    "parse_prompt",
    "read_looks",
]
