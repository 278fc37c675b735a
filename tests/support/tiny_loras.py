"""Random LoRA adapters for the tiny pipelines, made with PEFT and saved the way diffusers
saves a trained one (``save_lora_weights``: ``pytorch_lora_weights.safetensors``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from genhook.engines.local._residency import RESIDENCY

# The attention projections LoRA training targets in UNets and transformers alike.
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def random_loras(pipeline_dir: Path, pipeline: str, folders: list[Path]) -> list[Path]:
    """Random-weight adapters (one per folder, each seeded by its place) for the pipeline
    saved in ``pipeline_dir``: ``init_lora_weights=False`` makes both matrices random, so
    each changes the output, each its own way."""
    import diffusers
    import torch
    from peft import LoraConfig, get_peft_model_state_dict

    pipeline_class = getattr(diffusers, pipeline)
    pipe = pipeline_class.from_pretrained(pipeline_dir, local_files_only=True)
    denoiser: Any = getattr(pipe, "unet", None) or pipe.transformer
    key = "unet_lora_layers" if hasattr(pipe, "unet") else "transformer_lora_layers"
    for number, out in enumerate(folders):
        torch.manual_seed(number)
        config = LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS, init_lora_weights=False)
        with warnings.catch_warnings():  # PEFT warns of a second adapter: each is saved alone
            warnings.simplefilter("ignore", UserWarning)
            denoiser.add_adapter(config, adapter_name=f"a{number}")
        layers = get_peft_model_state_dict(denoiser, adapter_name=f"a{number}")
        out.mkdir(parents=True, exist_ok=True)
        pipeline_class.save_lora_weights(out, **{key: layers})
    return folders


def residency_counts() -> tuple[int, int]:
    """(in the model process) Model loads and unloads since it started."""
    return RESIDENCY.loads, RESIDENCY.unloads
