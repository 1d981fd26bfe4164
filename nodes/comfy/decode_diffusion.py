"""The diffusion-VAE decode node: LTX-2.5's best-quality video decoder, its attention backend and tiling exposed."""
from __future__ import annotations

from . import bridge
from .handles import latent_for_decoder
from .decode_tiling import ready_to_decode, tiling_inputs
from ..ltx.decode.tiling import TilingRequest
from ..ltx.device_memory import weight_bytes
from ..ltx.kernels.na_attention import PROCESSORS, make_processor

CATEGORY = "LTX-2.5/decode"
NODE = "LTX25DiffusionVAEDecode"
PROCESSOR_INPUT = (list(PROCESSORS), {"default": "auto", "tooltip": (
    "Neighborhood-attention backend. auto: the fastest one this machine has (NVIDIA Ampere or newer with Triton: "
    "the pack's triton kernel; other CUDA GPUs: comfy_kitchen for the small windows and sdpa for the 11x11x11 "
    "pixel stage; sdpa otherwise). sdpa: exact blocked PyTorch attention, runs anywhere. triton: the "
    "pack's fused kernel (CUDA GPUs, Ampere or newer). comfy_kitchen: its fused kernels on a CUDA GPU (slower than "
    "sdpa on the CPU). natten: NATTEN's CUDA kernels (a GPU and a natten build with libnatten; refused elsewhere, "
    "where it would need gigabytes per call). They compute the same attention, so the video differs only by "
    "rounding; speed and memory differ a lot.")})
# 512 px and 80-frame manual tiles; the overlaps are the released decoder's smallest safe ones
TILING_INPUTS = tiling_inputs(80, 512, 40, 160, "At least the decoder's receptive field (40 frames / 160 px for the "
                              "released decoder); a smaller overlap is refused, as it would leave seams.",
                              keeps_loaded=True)


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

    def decode(self, video_vae, latent, processor, steps, seed, tiling, tile_frames, tile_pixels, overlap_frames,
               overlap_pixels, memory_budget_gb):
        from ..ltx.decode import diffusion_vae as engine
        samples = latent_for_decoder(NODE, video_vae, latent, "diffusion", "ltx-2.5-video-vae-bf16.safetensors",
                                     "LTX-2.5 Conv VAE Decode")
        request = TilingRequest(tiling, tile_frames, tile_pixels, overlap_frames, overlap_pixels, memory_budget_gb)
        request.check(NODE, weight_bytes(video_vae.module))
        # before the weights load: a processor that cannot run here is refused at once
        attention = make_processor(processor, bridge.compute_device(), f"{NODE}.processor")
        # Room to decode untiled, or tiles that fit beside the loaded models rather than evicting the sampler's
        # transformer; auto then plans within `free`.
        shape, module = tuple(samples.shape), video_vae.module
        on_device = bridge.intermediate_device().type == bridge.compute_device().type  # the frames stay there
        untiled = engine.working_memory(module, shape, request, attention, on_device)
        vae, free = ready_to_decode(video_vae, request, untiled,
                                    lambda budget: engine.tiles_within(module, shape, request, budget, attention,
                                                                       on_device))
        images, stats = engine.decode(vae, samples, processor=attention, steps=steps, seed=seed, request=request,
                                      free_memory=free,
                                      on_step=bridge.step_callback(1, "diffusion VAE decode"),
                                      out_device=bridge.intermediate_device(), where=NODE,
                                      check=bridge.check_interrupt)
        # The ui entry carries the figures the canvas shows on the node (web/ltx25_ab_viewer.js).
        return {"ui": {"ltx25_decode_stats": [stats.as_dict()]}, "result": (images, stats)}


NODE_CLASS_MAPPINGS = {"LTX25DiffusionVAEDecode": LTX25DiffusionVAEDecode}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25DiffusionVAEDecode": "LTX-2.5 Diffusion VAE Decode"}
