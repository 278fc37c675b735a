"""What several engines share about pictures: decoding hostile input (``decode``), the NSFW
detector and the input check built on it (``nsfw``), prompt moderation (``moderation``),
fitting and encoding the output (``output``), and putting several inputs into one picture
(``compose``).

The built-in image-edit engine, the local models, image-to-video and the upstream proxy all
use these; none of them imports another engine's private modules
(``tests/unit/test_layering.py``). This module itself stays light: the API process reads
``FitMode`` without loading OpenCV or ONNX Runtime.
"""

import typing

# How a picture is brought to an exact size (``output.fit``); ``auto`` lets the engine choose.
FitMode = typing.Literal["auto", "cover", "contain", "stretch"]

__all__ = ["FitMode"]
