"""Facts of the LTX-2.5 release that more than one module needs: the official file of each component (its
ComfyUI models folder and name), the `model_version` and Gemma tag the released headers carry, and shipped metadata
blocks that the tiny writers, tests and benchmarks reproduce (docs/MODEL.md §2.1, §2.2, §9.1).

A leaf module (it imports nothing of the pack), so the engine, the face and the tools can all read it.
"""
from __future__ import annotations

from typing import Any, Mapping

MODEL_VERSION = "2.5.0"                 # the released headers' `model_version`
GEMMA_VERSION = "gemma4-12b-ltx-v1"     # the Gemma tag the transformer and the text encoder must share

# component → (ComfyUI models folder, official file name)
OFFICIAL_FILES: Mapping[str, tuple[str, str]] = {
    "transformer": ("diffusion_models", "ltx-2.5-22b-distilled-transformer-bf16.safetensors"),
    "text_encoder": ("text_encoders", "gemma4-12b-with-proj-ltx-2.5-bf16.safetensors"),
    "diffusion_vae": ("vae", "ltx-2.5-video-vae-bf16.safetensors"),
    "conv_vae": ("vae", "ltx-2.5-video-vae-conv-bf16.safetensors"),
    "audio_vae": ("vae", "ltx-2.5-audio-vae-bf16.safetensors"),
    "upsampler": ("latent_upscale_models", "ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors"),
}

# `config.scheduler` of the transformer file (the distilled sampler uses fixed sigmas and does not read it).
SHIPPED_SCHEDULER: Mapping[str, Any] = {"_class_name": "RectifiedFlowScheduler", "num_train_timesteps": 1000,
                                        "sampler": "LinearQuadratic", "shifting": None, "base_resolution": None}

# `config.vae` of ltx-2.5-video-vae-conv-bf16.safetensors (docs/MODEL.md §9.1: the 2.3 metadata, whose block lists
# 2.5 keeps byte-identical; 2.5 says latent_log_var "constant"). The loader reads it from the file; tests and
# benchmarks build the full-size decoder from it.
SHIPPED_CONV_VAE_CONFIG: Mapping[str, Any] = {
    "_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3, "latent_channels": 128,
    "encoder_blocks": [["res_x", {"num_layers": 4}], ["compress_space_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 6}], ["compress_time_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 4}], ["compress_all_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 2}], ["compress_all_res", {"multiplier": 1}],
                       ["res_x", {"num_layers": 2}]],
    "decoder_blocks": [["res_x", {"num_layers": 4}], ["compress_space", {"multiplier": 2}],
                       ["res_x", {"num_layers": 6}], ["compress_time", {"multiplier": 2}],
                       ["res_x", {"num_layers": 4}], ["compress_all", {"multiplier": 1}],
                       ["res_x", {"num_layers": 2}], ["compress_all", {"multiplier": 2}], ["res_x", {"num_layers": 2}]],
    "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4, "latent_log_var": "constant",
    "use_quant_conv": False, "causal_decoder": False, "timestep_conditioning": False,
    "normalize_latent_channels": False, "encoder_base_channels": 128, "decoder_base_channels": 128,
    "spatial_padding_mode": "zeros",
}
