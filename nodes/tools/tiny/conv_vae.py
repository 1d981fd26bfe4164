"""The tiny conv video VAE file: the shipped 2.5 layout (docs/MODEL.md §9.1) at tiny widths, in the native format
(`encoder.*`, `decoder.*`, `per_channel_statistics.*`, flat `config.vae`). Latent channels 128 and 32×32×8
compression like the real file, so latent shapes match.

Also the bundled conv encoder, which both video-VAE files carry: `encoder_tensors` builds the engine's encoder
(`nodes/ltx/encode/video_encoder.py`) from a native block list, randomly weighted, and names its tensors as the files
do (the engine's key map run backwards).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ...ltx.decode.conv_vae import KEY_MAP, LATENT_CHANNELS, ConvVAEConfig, ConvVideoVAE
from ...ltx.encode.video_encoder import KEY_MAP as ENCODER_KEY_MAP, VideoEncoder, VideoEncoderConfig
from ...ltx.release import MODEL_VERSION
from .common import latent_statistics, randomize_, save_native


def encoder_kwargs(vae: Mapping[str, Any]) -> dict[str, Any]:
    """`LTX2VideoEncoder3d` arguments from a native flat `config.vae` (`encoder_blocks`, `patch_size`, …), as the
    engine reads them."""
    return VideoEncoderConfig.from_metadata("config.vae", {"config": {"vae": vae}}, nested=False).diffusers_kwargs()


def encoder_tensors(config: VideoEncoderConfig, seed: int, salt: str) -> dict[str, torch.Tensor]:
    """The bundled encoder's native `encoder.*` tensors for `config`, randomly weighted."""
    encoder = randomize_(VideoEncoder(config).encoder, seed, salt)
    return ENCODER_KEY_MAP.to_native({f"encoder.{k}": v for k, v in encoder.state_dict().items()})


def _tiny_blocks(res: int, ups: tuple[tuple[str, int], ...]) -> list:
    blocks: list = [["res_x", {"num_layers": res}]]
    for name, multiplier in ups:
        blocks += [[name, {"multiplier": multiplier}], ["res_x", {"num_layers": res}]]
    return blocks


# The shipped 2.5 layout at tiny widths. The decoder keeps the nine-block list with 1 layer per stage and base 8. The
# encoder cannot be narrower than the latent (its first width is the latent's 128 channels): it saves size with ×1
# multipliers and one layer per res stage — one, not none, so every stage's resnets (80 of the real encoder's 84
# tensors) are in the file and its key map rows are exercised.
TINY_VAE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3,
    "latent_channels": LATENT_CHANNELS,
    "encoder_blocks": _tiny_blocks(1, (("compress_space_res", 1), ("compress_time_res", 1), ("compress_all_res", 1),
                                       ("compress_all_res", 1))),
    "decoder_blocks": _tiny_blocks(1, (("compress_space", 2), ("compress_time", 2), ("compress_all", 1),
                                       ("compress_all", 2))),
    "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4, "latent_log_var": "constant",
    "use_quant_conv": False, "causal_decoder": False, "timestep_conditioning": False,
    "normalize_latent_channels": False, "encoder_base_channels": LATENT_CHANNELS, "decoder_base_channels": 8,
    "spatial_padding_mode": "zeros",
}


def _local_(module: torch.nn.Module, leak: float = 0.02) -> torch.nn.Module:
    """Make the random tiny decoder local, like a trained one: each conv's centre tap gets unit gain (std
    1/√C_in) and every off-centre tap `leak` times that. Plain random 3×3×3 kernels spread every latent cell over
    the whole clip, which no tile overlap can hide; this keeps tile borders a ~1-cell effect, as in the real VAE."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.Conv3d):
                w = m.weight
                w.mul_(1.0 / (w.std() * math.sqrt(w.shape[1])))
                taps = torch.full(w.shape[2:], leak)
                taps[tuple(k // 2 for k in w.shape[2:])] = 1.0
                w.mul_(taps)
    return module


def write_tiny(path: str, seed: int = 0) -> str:
    """The tiny conv VAE file, written to `path`."""
    config = ConvVAEConfig.from_metadata(path, {"config": {"vae": TINY_VAE_CONFIG}})
    vae = _local_(randomize_(ConvVideoVAE(config), seed, "conv_vae"))
    mean, std = latent_statistics(seed)
    vae.latents_mean.copy_(mean)
    vae.latents_std.copy_(std)
    tensors = KEY_MAP.to_native(vae.state_dict())
    encoder = VideoEncoderConfig.from_metadata(path, {"config": {"vae": TINY_VAE_CONFIG}}, nested=False)
    tensors |= encoder_tensors(encoder, seed, "conv_vae_encoder")
    return save_native(path, tensors, {"config": {"vae": TINY_VAE_CONFIG}, "model_version": MODEL_VERSION})
