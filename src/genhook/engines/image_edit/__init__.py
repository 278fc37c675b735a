"""The built-in image-edit engine (``genhook/image-edit``): classical edits on the CPU.

See ``docs/engines/image-edit.md`` for the vocabulary, the fit policy and the error codes.
"""

from genhook.engines.image_edit._engine import ImageEditEngine
from genhook.engines.image_edit._moderation import BUILTIN_BLOCKED_TERMS
from genhook.engines.image_edit._parser import parse_prompt
from genhook.engines.image_edit._plan import OPERATIONS, EditPlan, FitPolicy, Step

__all__ = [
    "BUILTIN_BLOCKED_TERMS",
    "OPERATIONS",
    "EditPlan",
    "FitPolicy",
    "ImageEditEngine",
    "Step",
    "parse_prompt",
]
