"""Tiny LoRA files for the tiny transformer, in each key spelling LTX-2.5 LoRAs circulate in (docs/MODEL.md §15.5),
and the two extra files the dev two-stage template names (the dev transformer and the distilled LoRA).

    STYLES: peft      `diffusion_model.<native>.lora_A/.lora_B.weight` (the LTX-2 trainer's files, the reference's)
            comfyui   `model.diffusion_model.<native>.lora_down/.lora_up.weight` + `.alpha`
            kohya     `lora_unet_<native with _>.lora_down/.lora_up.weight` + `.alpha`
            diffusers `transformer.<diffusers name>.lora_A/.lora_B.weight`
"""
from __future__ import annotations

import os
from typing import Mapping

import torch

from ...ltx.dit.transformer import KEY_MAP, LTX25Transformer, TransformerConfig
from .common import generator, save_native
from .transformer import tiny_metadata, write_tiny as write_tiny_transformer

STYLES = ("peft", "comfyui", "kohya", "diffusers")
# IC-LoRAs: the `lora.target_modules` of the LTX-2 trainer's IC-LoRA configs (Lightricks/LTX-2 v1.2.0,
# packages/ltx-trainer/configs/{v2v,a2a,av2av}_ic_lora.yaml), matched as PEFT matches them (a module whose name is
# the target or ends with "." + target), and the metadata its checkpoints carry (training_strategies/*.py).
IC_LORA_TARGETS: Mapping[str, tuple[str, ...]] = {
    "v2v": ("attn1.to_k", "attn1.to_q", "attn1.to_v", "attn1.to_out.0", "attn2.to_k", "attn2.to_q", "attn2.to_v",
            "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"),
    "a2a": ("audio_attn1.to_k", "audio_attn1.to_q", "audio_attn1.to_v", "audio_attn1.to_out.0", "audio_attn2.to_k",
            "audio_attn2.to_q", "audio_attn2.to_v", "audio_attn2.to_out.0", "audio_ff.net.0.proj", "audio_ff.net.2"),
    "av2av": ("to_k", "to_q", "to_v", "to_out.0"),
}
NATIVE_PREFIX = "model.diffusion_model."
# The Linear layers LoRA trainers target in every DiT block (both streams, the cross-modal attentions, the FFs).
TARGET_LEAVES = ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight", "ff.net.0.proj.weight",
                 "ff.net.2.weight")
FACTOR_SCALE = 0.1  # each factor's std: a delta of about 0.01·sqrt(rank), beside weights of std 0.05
# The files the dev two-stage template loads besides the six official ones: component → (folder, official name).
DEV_FILES: Mapping[str, tuple[str, str]] = {
    "dev_transformer": ("diffusion_models", "ltx-2.5-22b-dev-transformer-bf16.safetensors"),
    "distilled_lora": ("loras", "ltx-2.5-22b-distilled-lora-450-bf16.safetensors"),
}
DEV_SEED_OFFSET = 1  # the tiny dev transformer's weights differ from the tiny distilled one's
# The IC-LoRA template's file (a user's own IC-LoRA in practice: no official 2.5 control IC-LoRA is named here). The
# tiny one thins its reference in time (every 2nd frame) and keeps its size, so the template also runs at the small
# clip the browser tests use (192×128: a half-size reference would not fit stage 1's 3×2 latent grid).
IC_LORA_FILE = ("loras", "ltx-2.5-ic-lora.safetensors")
TEMPLATE_IC_LORA_METADATA = {"reference_temporal_scale_factor": "2"}


def _tiny_module() -> LTX25Transformer:
    """The tiny transformer's module tree on the meta device (names and shapes only)."""
    with torch.device("meta"):
        return LTX25Transformer(TransformerConfig.from_metadata("tiny LoRA", tiny_metadata()))


def tiny_lora_factors(seed: int = 0, rank: int = 4) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module weight key: (up [out, rank], down [rank, in])} for every targeted Linear of the tiny DiT, float32
    values that bf16 holds exactly (so a file written from them reads back to the same numbers)."""
    g = generator(seed, f"lora{rank}")
    factors = {}
    for key, tensor in sorted(_tiny_module().state_dict().items()):
        if key.startswith("dit.transformer_blocks.") and key.endswith(TARGET_LEAVES):
            out_features, in_features = tensor.shape
            up = (torch.randn(out_features, rank, generator=g) * FACTOR_SCALE).bfloat16().float()
            down = (torch.randn(rank, in_features, generator=g) * FACTOR_SCALE).bfloat16().float()
            factors[key] = (up, down)
    return factors


def _file_base(module_key: str, style: str) -> str:
    """`dit.transformer_blocks.0.attn1.to_q.weight` → the style's base name (no suffix)."""
    native = next(iter(KEY_MAP.to_native({module_key: torch.empty(0)})))[len(NATIVE_PREFIX): -len(".weight")]
    return {"peft": f"diffusion_model.{native}", "comfyui": f"{NATIVE_PREFIX}{native}",
            "kohya": "lora_unet_" + native.replace(".", "_"),
            "diffusers": "transformer." + module_key[len("dit."): -len(".weight")]}[style]


def lora_file_tensors(factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], style: str,
                      alpha: float | None = None) -> dict[str, torch.Tensor]:
    """The file's tensors in `style`; `alpha` (kohya/comfyui only) is written for every pair."""
    if style not in STYLES:
        raise ValueError(f"style {style!r}: one of {STYLES}")
    down_suffix, up_suffix = (".lora_A.weight", ".lora_B.weight") if style in ("peft", "diffusers") else \
        (".lora_down.weight", ".lora_up.weight")
    tensors = {}
    for key, (up, down) in factors.items():
        base = _file_base(key, style)
        tensors[base + down_suffix], tensors[base + up_suffix] = down, up
        if alpha is not None and style in ("comfyui", "kohya"):
            tensors[base + ".alpha"] = torch.tensor(float(alpha))
    return tensors


def write_tiny_lora(path: str, style: str = "peft", seed: int = 0, rank: int = 4, alpha: float | None = None) -> str:
    """A tiny LoRA for the tiny transformer, bf16 like the released LoRA."""
    return save_native(path, lora_file_tensors(tiny_lora_factors(seed, rank), style, alpha), {})


def ic_lora_tensors(variant: str, seed: int = 0, rank: int = 4) -> dict[str, torch.Tensor]:
    """An IC-LoRA's tensors as the LTX-2 trainer saves them: PEFT's `lora_A`/`lora_B` for every DiT-block Linear the
    `variant`'s targets match, under `diffusion_model.` + the native module name (no alpha: PEFT files have none)."""
    g = generator(seed, f"ic-lora-{variant}{rank}")
    tensors = {}
    for key, tensor in sorted(_tiny_module().state_dict().items()):
        if not (key.startswith("dit.transformer_blocks.") and key.endswith(".weight") and tensor.ndim == 2):
            continue
        native = next(iter(KEY_MAP.to_native({key: torch.empty(0)})))[len(NATIVE_PREFIX): -len(".weight")]
        if not any(native == t or native.endswith("." + t) for t in IC_LORA_TARGETS[variant]):
            continue
        out_features, in_features = tensor.shape
        tensors[f"diffusion_model.{native}.lora_A.weight"] = torch.randn(rank, in_features, generator=g) * 0.1
        tensors[f"diffusion_model.{native}.lora_B.weight"] = torch.randn(out_features, rank, generator=g) * 0.1
    return tensors


def write_tiny_ic_lora(path: str, variant: str = "v2v", seed: int = 0, rank: int = 4,
                       metadata: Mapping[str, str] | None = None) -> str:
    """A tiny IC-LoRA (`ic_lora_tensors`) with the trainer's metadata: by default a reference video at half the
    output's size (`reference_spatial_scale_factor` and its older name `reference_downscale_factor`, both "2")."""
    meta = {"reference_spatial_scale_factor": "2", "reference_downscale_factor": "2"} if metadata is None else metadata
    return save_native(path, ic_lora_tensors(variant, seed, rank), dict(meta))


def dev_paths(out_dir: str) -> dict[str, str]:
    return {component: os.path.join(out_dir, folder, name) for component, (folder, name) in DEV_FILES.items()}


def write_tiny_dev_files(out_dir: str, seed: int = 0) -> dict[str, str]:
    """The templates' files beyond the six official ones, into `out_dir`: the tiny dev transformer (the tiny
    transformer's config and metadata, other weights: the released dev and distilled files are told apart by name
    only), the tiny distilled LoRA (peft spelling) and the IC-LoRA template's tiny IC-LoRA (key "ic_lora")."""
    paths = {**dev_paths(out_dir), "ic_lora": os.path.join(out_dir, *IC_LORA_FILE)}
    if not os.path.exists(paths["dev_transformer"]):
        write_tiny_transformer(paths["dev_transformer"], seed + DEV_SEED_OFFSET)
    if not os.path.exists(paths["distilled_lora"]):
        write_tiny_lora(paths["distilled_lora"], "peft", seed)
    if not os.path.exists(paths["ic_lora"]):
        os.makedirs(os.path.dirname(paths["ic_lora"]), exist_ok=True)
        write_tiny_ic_lora(paths["ic_lora"], "v2v", seed, metadata=TEMPLATE_IC_LORA_METADATA)
    return paths
