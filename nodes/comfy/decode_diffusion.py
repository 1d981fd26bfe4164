"""The diffusion-VAE decode node: LTX-2.5's best-quality video decoder, its attention backend and tiling exposed."""
from __future__ import annotations

from . import bridge
from .handles import latent_for_decoder
from ..ltx.decode.diffusion_vae import TILING_MODES
from ..ltx.errors import LTX25Error
from ..ltx.kernels.na_attention import PROCESSORS

CATEGORY = "LTX-2.5/decode"
NODE = "LTX25DiffusionVAEDecode"
PROCESSOR_INPUT = (list(PROCESSORS), {"default": "auto", "tooltip": (
    "Neighborhood-attention backend. auto: the fastest one this machine has (NVIDIA Ampere or newer with Triton: "
    "the pack's triton kernel; other CUDA GPUs: comfy_kitchen for the small windows and sdpa for the 11x11x11 "
    "pixel stage; sdpa otherwise). sdpa: exact blocked PyTorch attention, runs anywhere. triton: the "
    "pack's fused kernel. "
    "All give the same video within float tolerance.")})
TILING_INPUTS = {
    "tiling": (list(TILING_MODES), {"default": "auto", "tooltip": (
        "auto: tile only when the decode would not fit the memory budget. off: one tile. manual: the sizes below. "
        "Overlaps are always the decoder's safe 40 frames / 160 px.")}),
    "tile_frames": ("INT", {"default": 80, "min": 16, "max": 4096, "step": 8,
                            "tooltip": "Manual tiling: frames per tile (≥ 2× the 40-frame overlap)."}),
    "tile_pixels": ("INT", {"default": 512, "min": 64, "max": 8192, "step": 32,
                            "tooltip": "Manual tiling: tile height and width in pixels (≥ 2× the 160-px overlap)."}),
    "memory_budget_gb": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 4096.0, "step": 0.5, "tooltip": (
        "auto tiling: GiB the decode may use, weights included. 0 = the free device memory after other models "
        "are evicted.")}),
}


class LTX25DiffusionVAEDecode:
    DESCRIPTION = "Decodes a video latent with the LTX-2.5 diffusion VAE (neighborhood-attention denoiser), tiled."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "LTX25_DECODE_STATS")
    RETURN_NAMES = ("images", "stats")
    OUTPUT_TOOLTIPS = ("Decoded frames [F, H, W, 3] in [0, 1].", "Seconds, peak memory, processor, tiles, steps.")
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "video_vae": ("LTX25_VIDEO_VAE", {"tooltip": "The diffusion video VAE (ltx-2.5-video-vae-bf16)."}),
            "latent": ("LATENT", {"tooltip": "Video latent [B, 128, F', H/32, W/32] from the sampler."}),
            "processor": PROCESSOR_INPUT,
            "steps": ("INT", {"default": 0, "min": 0, "max": 50, "tooltip": "Denoising steps; 0 = the file's (1)."}),
            # False on purpose: the frontend gives any INT named "seed" a "control after generate" widget unless
            # told not to, which adds a widgets_values slot the shipped templates do not have (it shifted tiling).
            "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": False,
                             "tooltip": "Seed of the decoder's start noise."}),
            **TILING_INPUTS}}

    def decode(self, video_vae, latent, processor, steps, seed, tiling, tile_frames, tile_pixels, memory_budget_gb):
        from ..ltx.decode import diffusion_vae as engine
        samples = latent_for_decoder(NODE, video_vae, latent, "diffusion", "ltx-2.5-video-vae-bf16.safetensors",
                                     "LTX-2.5 Conv VAE Decode")
        weights = bridge.module_bytes(video_vae.module)
        if 0 < memory_budget_gb * 2**30 <= weights:
            raise LTX25Error(f"{NODE}.memory_budget_gb", "the budget", f"{memory_budget_gb} GiB",
                             f"more than the decoder's own {weights / 2**30:.2f} GiB of weights",
                             "Raise it, or set 0 to use the free device memory.")
        vae = video_vae.ready(engine.decode_memory_estimate(video_vae.module, tuple(samples.shape)))
        budget = (int(memory_budget_gb * 2**30) - weights if memory_budget_gb > 0
                  else bridge.free_device_memory())
        images, stats = engine.decode(vae, samples, processor=processor, steps=steps, seed=seed, tiling_mode=tiling,
                                      tile_frames=tile_frames, tile_pixels=tile_pixels, budget_bytes=budget,
                                      on_step=bridge.step_callback(1, "diffusion VAE decode"),
                                      out_device=bridge.intermediate_device())
        # The ui entry carries the figures the canvas shows on the node (web/ltx25_ab_viewer.js).
        return {"ui": {"ltx25_decode_stats": [stats.as_dict()]}, "result": (images, stats)}


NODE_CLASS_MAPPINGS = {"LTX25DiffusionVAEDecode": LTX25DiffusionVAEDecode}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25DiffusionVAEDecode": "LTX-2.5 Diffusion VAE Decode"}
