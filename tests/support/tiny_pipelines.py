"""Tiny random-weight diffusers pipelines, built in code and saved with ``save_pretrained``.

The way diffusers' own fast tests build theirs (tiny UNet or transformer, VAE and text-encoder
configs), except that the tokenizers are made here from a small vocabulary instead of being
downloaded: nothing in the test suite touches the network. Each builder writes a directory the
local-model loader reads exactly as it reads a downloaded model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# The CLIP tokenizer's byte-level alphabet (GPT-2's), so any prompt tokenizes.


def _byte_chars() -> list[str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    extra = 0
    for byte in range(256):
        if byte not in keep:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def _clip_tokenizer() -> Any:
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {}
    for char in _byte_chars():
        vocab[char] = len(vocab)
    for char in _byte_chars():
        vocab[char + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _t5_tokenizer() -> Any:
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
    pieces += [(c, -2.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789.,"]
    pieces += [("▁" + c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def _clip_text(projection: bool = False) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=2,
        hidden_size=32,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=2,
        pad_token_id=1,
        vocab_size=1000,
        hidden_act="gelu",
        projection_dim=32,
    )
    return CLIPTextModelWithProjection(config) if projection else CLIPTextModel(config)


def _t5_text() -> Any:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        vocab_size=1000,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(config)


def _sd_vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        layers_per_block=1,
    )


def _flux_vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def instruct_pix2pix() -> Any:
    from diffusers import (
        EulerAncestralDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        UNet2DConditionModel,
    )

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=16,
        in_channels=8,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    return StableDiffusionInstructPix2PixPipeline(
        unet=unet,
        scheduler=EulerAncestralDiscreteScheduler(),
        vae=_sd_vae(),
        text_encoder=_clip_text(),
        tokenizer=_clip_tokenizer(),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )


def sdxl() -> Any:
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
        norm_num_groups=1,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
    )
    return StableDiffusionXLPipeline(
        unet=unet,
        scheduler=scheduler,
        vae=_sd_vae(),
        text_encoder=_clip_text(),
        tokenizer=_clip_tokenizer(),
        text_encoder_2=_clip_text(projection=True),
        tokenizer_2=_clip_tokenizer(),
        image_encoder=None,
        feature_extractor=None,
    )


def _flux(cls_name: str) -> Any:
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    pipeline_class = getattr(diffusers, cls_name)
    return pipeline_class(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_flux_vae(),
        text_encoder=_clip_text(),
        tokenizer=_clip_tokenizer(),
        text_encoder_2=_t5_text(),
        tokenizer_2=_t5_tokenizer(),
        image_encoder=None,
        feature_extractor=None,
    )


def flux() -> Any:
    return _flux("FluxPipeline")


def flux_kontext() -> Any:
    return _flux("FluxKontextPipeline")


def ltx_image_to_video() -> Any:
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXImageToVideoPipeline,
        LTXVideoTransformer3DModel,
    )

    transformer = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=32,
    )
    vae = AutoencoderKLLTXVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    return LTXImageToVideoPipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=_t5_text(),
        tokenizer=_t5_tokenizer(),
    )


# Qwen2-VL's special tokens that the processor and Qwen-Image-Edit's prompt template use.
_QWEN_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def _qwen_tokenizer() -> Any:
    """Byte-level BPE without merges: one token a byte (GPT-2's alphabet), then the specials."""
    from transformers import Qwen2TokenizerFast

    vocab = {char: index for index, char in enumerate(_byte_chars())}
    for token in _QWEN_SPECIAL:
        vocab[token] = len(vocab)
    return Qwen2TokenizerFast(
        vocab=vocab,
        merges=[],
        model_max_length=1024,
        eos_token="<|im_end|>",
        additional_special_tokens=_QWEN_SPECIAL[1:],
    )


def qwen_image_edit() -> Any:
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from genhook.engines.local._qwen import image_processor_class

    tokenizer = _qwen_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in _QWEN_SPECIAL}
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": len(tokenizer),
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default"},
            "rope_theta": 1000000.0,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": 16,
        },
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
    )
    # The image as 2*2 patches of 14 pixels merged into one token: 56*56 pixels, one token.
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=56 * 56)
    processor = image_processor_class()(image_processor=image_processor, tokenizer=tokenizer)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    # The pipeline encodes its input at about one megapixel whatever the output size: four
    # channels, no residual blocks on the way down and four halvings (the real VAE has three)
    # keep that cheap on a CPU.
    z_dim = 4
    vae = AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1, 1],
        num_res_blocks=0,
        temperal_downsample=[False, True, True, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    return QwenImageEditPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=Qwen2_5_VLForConditionalGeneration(config),
        tokenizer=tokenizer,
        processor=processor,
    )


def instruct_pix2pix_real_size() -> Any:
    """InstructPix2Pix at Stable Diffusion 1.5's sizes (UNet, VAE, CLIP ViT-L text encoder),
    random weights: what a benchmark on a real card needs, without a download."""
    from diffusers import (
        AutoencoderKL,
        EulerAncestralDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    unet = UNet2DConditionModel(
        sample_size=64,
        in_channels=8,
        out_channels=4,
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        cross_attention_dim=768,
        attention_head_dim=8,
    )
    vae = AutoencoderKL(
        block_out_channels=[128, 256, 512, 512],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        layers_per_block=2,
        sample_size=512,
    )
    text = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_attention_heads=12,
            num_hidden_layers=12,
            vocab_size=49408,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            projection_dim=768,
        )
    )
    return StableDiffusionInstructPix2PixPipeline(
        unet=unet,
        scheduler=EulerAncestralDiscreteScheduler(),
        vae=vae,
        text_encoder=text,
        tokenizer=_clip_tokenizer(),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )


BUILDERS: dict[str, Callable[[], Any]] = {
    "StableDiffusionInstructPix2PixPipeline": instruct_pix2pix,
    "StableDiffusionXLPipeline": sdxl,
    "FluxPipeline": flux,
    "FluxKontextPipeline": flux_kontext,
    "LTXImageToVideoPipeline": ltx_image_to_video,
    "QwenImageEditPipeline": qwen_image_edit,
}


def build(pipeline: str, directory: Path, seed: int = 0, real_size: bool = False) -> Path:
    """Build the tiny ``pipeline`` (or, ``real_size``, the SD-1.5-sized InstructPix2Pix in
    float16) with weights from ``seed`` and save it in ``directory``."""
    torch.manual_seed(seed)
    real = real_size and pipeline == "StableDiffusionInstructPix2PixPipeline"
    pipe = instruct_pix2pix_real_size().to(torch.float16) if real else BUILDERS[pipeline]()
    pipe.save_pretrained(directory, safe_serialization=True)
    if pipeline == "QwenImageEditPipeline":
        _name_the_stock_processor(directory)
    return directory


def build_once(pipeline: str, directory: Path, real_size: bool = False) -> Path:
    """``build``, unless ``directory`` already holds ``pipeline`` (the benchmarks of one GPU
    check share one SD-1.5-sized build instead of spending a minute on each)."""
    index = directory / "model_index.json"
    if index.exists() and json.loads(index.read_text()).get("_class_name") == pipeline:
        return directory
    return build(pipeline, directory, real_size=real_size)


def _name_the_stock_processor(directory: Path) -> None:
    """The processor was built as genhook's image-only subclass (the stock one needs
    torchvision); a published Qwen-Image-Edit directory names ``Qwen2VLProcessor``, and so
    does this one."""
    for file, key, value in (
        (directory / "model_index.json", "processor", ["transformers", "Qwen2VLProcessor"]),
        (directory / "processor" / "processor_config.json", "processor_class", "Qwen2VLProcessor"),
    ):
        content = json.loads(file.read_text())
        content[key] = value
        file.write_text(json.dumps(content, indent=2))
