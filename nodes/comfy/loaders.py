"""Loader nodes: one per official split file. Each inspects the file (kind, version), builds the engine module
strictly and registers it with model management; weights reach the GPU only when a node needs them."""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Callable

import torch

from . import bridge
from .handles import Loaded
from ..ltx.errors import LTX25Error
from ..ltx.files.assets import Kind, expect_kind, inspect_asset

CATEGORY = "LTX-2.5/loaders"
AS_STORED = "as stored"  # None to the engine: quantized weights (NVFP4, FP8, int8) stay quantized, the rest bf16
WEIGHT_DTYPES = {AS_STORED: None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FP8_COMPUTE = "fp8 compute (opt-in)"  # the transformer only: bf16, then the DiT blocks' Linears in FP8


def file_input(folder: str, tooltip: str, *kinds: Kind) -> tuple:
    """A loader's file widget: the folder's files of `kinds` first (files_of_kind)."""
    return (files_of_kind(folder, kinds), {"tooltip": f"{tooltip} (from models/{folder}/)"})


def files_of_kind(folder: str, kinds: tuple[Kind, ...]) -> list[str]:
    """The folder's files for a loader of `kinds`: those whose header says so first, then those a header read
    cannot place (another model's file, an unreadable header: the loader names the problem); LTX-2.5 files of
    another kind are left out. vae/ holds both video VAEs, the audio VAE and every other model's VAEs."""
    mine, unplaced = [], []
    for name in bridge.list_model_files(folder):
        kind = _kind_of(folder, name)
        if kind in kinds:
            mine.append(name)
        elif kind is None:
            unplaced.append(name)
    return mine + unplaced


def _kind_of(folder: str, name: str) -> Kind | None:
    try:
        path = bridge.model_file_path(folder, name)
        stat = os.stat(path)
    except (LTX25Error, OSError):  # a dangling link, or removed since the listing: the loader says so if picked
        return None
    return _header_kind(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=512)
def _header_kind(path: str, mtime_ns: int, size: int) -> Kind | None:
    """The LTX-2.5 kind a file's header declares, or None when it declares none (cached per file version: the
    widgets are listed on every /object_info)."""
    try:
        return inspect_asset(path).kind
    except LTX25Error:  # not an LTX-2.5 split file or not readable: listed after the right kind, never hidden
        return None


def dtype_input(as_stored: bool = False) -> tuple:
    """`as_stored` for the components released quantized (transformer, text encoder): 'as stored' first and the
    default. The others are released in bf16 only and keep bf16 as their default."""
    if as_stored:
        return (list(WEIGHT_DTYPES), {"default": AS_STORED, "tooltip": "'as stored' keeps NVFP4/FP8/int8 weights "
                                      "quantized on the GPU (less memory); a dtype dequantizes the whole file to it."})
    return ([d for d in WEIGHT_DTYPES if d != AS_STORED], {"default": "bf16", "tooltip": "Weight dtype."})


def load_registered(folder: str, file_name: str, kinds: Kind | tuple[Kind, ...], load: Callable[..., torch.nn.Module],
                    weight_dtype: str) -> Loaded:
    """A loader node's work: the file checked to be of `kinds`, its module built by `load(path, dtype)` and registered
    with model management (weights offloaded until a node needs them)."""
    info = expect_kind(bridge.model_file_path(folder, file_name), kinds)
    return Loaded.register(load(info.path, WEIGHT_DTYPES[weight_dtype]), info)


class LTX25TransformerLoader:
    DESCRIPTION = "Loads the LTX-2.5 transformer (DiT and both embeddings connectors) from its split file."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_MODEL",)
    OUTPUT_TOOLTIPS = ("The 22B audio+video transformer with its connectors.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "transformer_file": file_input("diffusion_models", "ltx-2.5-22b-distilled-transformer-bf16.safetensors",
                                            Kind.TRANSFORMER),
            "weight_dtype": _transformerdtype_input()}}

    def load(self, transformer_file: str, weight_dtype: str):
        from ..ltx.dit.accelerated_denoise import release
        from ..ltx.dit.transformer import load_transformer
        info = expect_kind(bridge.model_file_path("diffusion_models", transformer_file), Kind.TRANSFORMER)
        fp8 = weight_dtype == FP8_COMPUTE
        module = load_transformer(info.path, torch.bfloat16 if fp8 else WEIGHT_DTYPES[weight_dtype], fp8_compute=fp8)
        # The sampler's CUDA graphs hold a forward's activations: free them whenever the weights are offloaded.
        return (Loaded.register(module, info, on_unload=release),)


def _transformerdtype_input() -> tuple:
    choices, options = dtype_input(as_stored=True)
    return ([*choices, FP8_COMPUTE], {**options, "tooltip": options["tooltip"] + (
        f" '{FP8_COMPUTE}': the file in bf16, then the 48 blocks' linear layers quantized to FP8 (E4M3, one scale "
        "per output row; activations scaled per token at run time) for FP8 tensor-core GEMMs on GPUs of compute "
        "capability 9.0 or newer; attention stays bf16. Faster and half the blocks' memory, at an error against "
        "bf16 measured in docs/PERFORMANCE.md.")})


class LTX25TextEncoderLoader:
    DESCRIPTION = ("Points at the Gemma-4 text encoder file. The 12B encoder is loaded by Encode Prompt only when "
                   "a prompt is not cached, and freed after use.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_TEXT_ENCODER",)
    OUTPUT_TOOLTIPS = ("The text encoder file, checked, with its tokenizer.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "text_encoder_file": file_input("text_encoders", "gemma4-12b-with-proj-ltx-2.5-bf16.safetensors",
                                             Kind.TEXT_ENCODER),
            "weight_dtype": dtype_input(as_stored=True)},
            "optional": {"device": (["auto", "cpu"], {"default": "auto", "tooltip": (
                "auto: Gemma runs on the GPU through model management, its layers streamed from host memory when "
                "the card is too small for it. cpu: it runs on the CPU — much slower, but it takes no GPU memory.")})}}

    def load(self, text_encoder_file: str, weight_dtype: str, device: str = "auto"):
        from ..ltx.text.encoder import TextEncoderSpec
        info = expect_kind(bridge.model_file_path("text_encoders", text_encoder_file), Kind.TEXT_ENCODER)
        return (TextEncoderSpec.from_file(info.path, WEIGHT_DTYPES[weight_dtype], device),)


class LTX25VideoVAELoader:
    DESCRIPTION = "Loads a video VAE decoder; the kind (conv or diffusion) is read from the file."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_VIDEO_VAE", "STRING")
    RETURN_NAMES = ("video_vae", "kind")
    OUTPUT_TOOLTIPS = ("The video decoder and its latent statistics.", "'conv' or 'diffusion'.")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "vae_file": file_input("vae", "ltx-2.5-video-vae-bf16 (diffusion) or ltx-2.5-video-vae-conv-bf16 (conv)",
                                    Kind.DIFFUSION_VAE, Kind.CONV_VAE),
            "weight_dtype": dtype_input()}}

    def load(self, vae_file: str, weight_dtype: str):
        info = expect_kind(bridge.model_file_path("vae", vae_file), (Kind.DIFFUSION_VAE, Kind.CONV_VAE))
        if info.kind is Kind.DIFFUSION_VAE:
            from ..ltx.decode.diffusion_vae import load_diffusion_vae as load
        else:
            from ..ltx.decode.conv_vae import load_conv_vae as load
        label = "diffusion" if info.kind is Kind.DIFFUSION_VAE else "conv"
        return (Loaded.register(load(info.path, WEIGHT_DTYPES[weight_dtype]), info), label)


class LTX25AudioVAELoader:
    DESCRIPTION = "Loads the LTX-2.5 audio VAE decoder and its vocoder (bandwidth extension to 48 kHz)."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_AUDIO_VAE",)
    OUTPUT_TOOLTIPS = ("Audio decoder + vocoder (the vocoder always runs in float32).",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"audio_vae_file": file_input("vae", "ltx-2.5-audio-vae-bf16.safetensors", Kind.AUDIO_VAE),
                             "weight_dtype": dtype_input()}}

    def load(self, audio_vae_file: str, weight_dtype: str):
        from ..ltx.audio_vae import load_audio_vae
        return (load_registered("vae", audio_vae_file, Kind.AUDIO_VAE, load_audio_vae, weight_dtype),)


class LTX25UpsamplerLoader:
    DESCRIPTION = "Loads the LTX-2.5 latent spatial upscaler (x2)."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_UPSAMPLER",)
    OUTPUT_TOOLTIPS = ("The latent upsampler.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "upsampler_file": file_input("latent_upscale_models",
                                          "ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors", Kind.UPSAMPLER),
            "weight_dtype": dtype_input()}}

    def load(self, upsampler_file: str, weight_dtype: str):
        from ..ltx.upsampler import load_upsampler
        return (load_registered("latent_upscale_models", upsampler_file, Kind.UPSAMPLER, load_upsampler, weight_dtype),)


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (LTX25TransformerLoader, LTX25TextEncoderLoader, LTX25VideoVAELoader,
                                                LTX25AudioVAELoader, LTX25UpsamplerLoader)}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LTX25TransformerLoader": "LTX-2.5 Load Transformer",
    "LTX25TextEncoderLoader": "LTX-2.5 Load Text Encoder",
    "LTX25VideoVAELoader": "LTX-2.5 Load Video VAE",
    "LTX25AudioVAELoader": "LTX-2.5 Load Audio VAE",
    "LTX25UpsamplerLoader": "LTX-2.5 Load Latent Upsampler",
}
