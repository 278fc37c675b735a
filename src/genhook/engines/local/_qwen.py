"""Qwen-Image-Edit's processor, loaded without the video processor it never uses.

The pipeline's ``processor`` is a ``Qwen2VLProcessor`` (tokenizer, image processor and video
processor). Transformers 5 builds the video processor only with torchvision installed, so the
stock class does not load on a worker without it, although the pipeline passes it images
alone. This subclass takes the image processor and the tokenizer only; everything else,
the image-token expansion included, is ``Qwen2VLProcessor``'s own.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any


@cache
def image_processor_class() -> Any:
    from transformers import Qwen2VLProcessor

    class QwenImageProcessor(Qwen2VLProcessor):
        """``Qwen2VLProcessor`` with an image processor and a tokenizer, no video processor."""

        def __init__(
            self,
            image_processor: Any = None,
            tokenizer: Any = None,
            chat_template: Any = None,
            **kwargs: Any,
        ) -> None:
            # What Qwen2VLProcessor.__init__ sets; then the mixin's own __init__, which
            # checks and keeps the components that the signature above names.
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = getattr(
                tokenizer, "image_token_id", None
            ) or tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = getattr(
                tokenizer, "video_token_id", None
            ) or tokenizer.convert_tokens_to_ids(self.video_token)
            super(Qwen2VLProcessor, self).__init__(  # type: ignore[no-untyped-call]
                image_processor, tokenizer, chat_template=chat_template, **kwargs
            )

    return QwenImageProcessor


def load_processor(folder: Path) -> Any:
    """The processor saved in ``folder`` (a pipeline's ``processor`` component)."""
    return image_processor_class().from_pretrained(folder, local_files_only=True)
