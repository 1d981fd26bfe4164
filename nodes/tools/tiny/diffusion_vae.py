"""The tiny diffusion video VAE file in the exact native layout: fused qkv, `attn.proj`, `t_embedder.mlp`, the unused
`type_emb`, the bundled conv encoder `encoder.*`, per-channel statistics and the nested `config.vae` metadata.

Every reader builds the encoder from `config.vae.encoder` (the pack's encoder loader and ComfyUI's VAELoader load
it strictly; ComfyUI with `base_channels` 128 when the block does not say): the block declares every field, and the
tensors are those of a real encoder built from it — the tiny conv VAE's layout, as both released video-VAE files
bundle one encoder."""
from __future__ import annotations

import torch
from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoDiffusionDecoderModel

from ...ltx.decode.diffusion_vae import CLASS_NAME, KEY_MAP, DiffusionVAEConfig
from ...ltx.encode.video_encoder import VideoEncoderConfig
from ...ltx.release import MODEL_VERSION
from .common import TINY_DIMS, generator, latent_statistics, randomize_, save_native
from .conv_vae import TINY_VAE_CONFIG, encoder_tensors

TINY_DECODER = {
    "in_channels": TINY_DIMS["latent_channels"], "out_channels": 3, "patch_size": 4, "head_dim": 16,
    "stage_channels": [256, 128, 64, 64, 32], "stage_depths": [1, 1, 1, 1, 1],
    # kernels of 3 keep the receptive field small, so the reference tiling rules (halo = depth·(k//2), overlap =
    # halo rounded to the latent grid, floors) scale down to a few cells and tiled tests stay tiny
    "stage_kernels": [[3, 3, 3]] * 5, "upsamples": [[[1, 2, 2], 2], [[2, 1, 1], 2], [[2, 2, 2], 1], [[2, 2, 2], 2]],
    "stage5_kernel": [3, 3, 3], "timestep_scale_multiplier": 1000.0, "default_num_inference_steps": 1,
    "resampler_kind": "linear", "spatial_padding_mode": "zeros",
}
# `config.vae.encoder` in the diffusion file's own names (`blocks`, `base_channels`): the tiny conv VAE's encoder.
TINY_ENCODER = {"in_channels": 3, "out_channels": TINY_DIMS["latent_channels"], "patch_size": 4, "dims": 3,
                "norm_layer": "pixel_norm", "latent_log_var": "constant", "spatial_padding_mode": "zeros",
                "base_channels": TINY_VAE_CONFIG["encoder_base_channels"], "blocks": TINY_VAE_CONFIG["encoder_blocks"]}




def write_tiny(path: str, seed: int) -> str:
    """The tiny diffusion-VAE file, written to `path`."""
    metadata = {"config": {"vae": {"_class_name": CLASS_NAME, "encoder": TINY_ENCODER, "decoder": TINY_DECODER,
                                   "model_output_type": "x0"}},
                "model_version": MODEL_VERSION}
    config = DiffusionVAEConfig.from_metadata(path, metadata)
    model = randomize_(LTX2VideoDiffusionDecoderModel(**config.diffusers_kwargs()), seed, "diffusion_vae", 0.1)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("latents_")}
    tensors = KEY_MAP.to_native(state)
    mean, std = latent_statistics(seed)
    tensors["per_channel_statistics.mean-of-means"], tensors["per_channel_statistics.std-of-means"] = mean, std
    tensors["decoder.type_emb"] = torch.randn(config.in_channels, generator=generator(seed, "diffusion_vae.type"))
    encoder = VideoEncoderConfig.from_metadata(path, metadata, nested=True)
    tensors.update(encoder_tensors(encoder, seed, "diffusion_vae.encoder"))
    return save_native(path, tensors, metadata)
