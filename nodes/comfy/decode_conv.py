"""The conv-VAE decode node: LTX-2.5's fast video decoder, with spatio-temporal tiling."""
from __future__ import annotations

from . import bridge
from .handles import latent_for_decoder
from ..ltx.decode.conv_tiling import MODES, TilingRequest

CATEGORY = "LTX-2.5/decode"
NODE = "LTX25ConvVAEDecode"


def tiling_inputs(spatial_tile: int = 768, spatial_overlap: int = 64, temporal_tile: int = 80,
                  temporal_overlap: int = 24) -> dict:
    """The tiling widget group (mode + tile/overlap sizes in pixels and frames) with the given defaults
    (the reference's conv-VAE defaults unless told)."""
    return {
        "tiling": (list(MODES), {"default": "auto", "tooltip": (
            "auto: tile only when the untiled decode would not fit in the free device memory, then the largest "
            "tiles that fit (with the overlaps below). off: decode in one piece. manual: the sizes below.")}),
        "spatial_tile": ("INT", {"default": spatial_tile, "min": 64, "max": 8192, "step": 32,
                                 "tooltip": "Manual tiling: tile height and width in pixels (a multiple of 32)."}),
        "spatial_overlap": ("INT", {"default": spatial_overlap, "min": 0, "max": 2048, "step": 32, "tooltip": (
            "Pixels neighbouring tiles share and cross-fade; larger hides seams better, costs more.")}),
        "temporal_tile": ("INT", {"default": temporal_tile, "min": 8, "max": 8192, "step": 8,
                                  "tooltip": "Manual tiling: frames per temporal tile (a multiple of 8)."}),
        "temporal_overlap": ("INT", {"default": temporal_overlap, "min": 0, "max": 2048, "step": 8, "tooltip": (
            "Frames cross-faded between temporal tiles (a multiple of 8); one more latent frame is always shared "
            "so the causal first frame of a tile can be dropped.")}),
    }


TILING_INPUTS = tiling_inputs()


class LTX25ConvVAEDecode:
    DESCRIPTION = "Decodes a video latent with the LTX-2.5 conv VAE, tiled in space and time when memory is short."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "LTX25_DECODE_STATS")
    RETURN_NAMES = ("images", "stats")
    OUTPUT_TOOLTIPS = ("Decoded frames [F, H, W, 3] in [0, 1] (batch items one after another).",
                       "Seconds, peak device memory, tile count and sizes (for LTX-2.5 Decoder Compare).")
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "video_vae": ("LTX25_VIDEO_VAE", {"tooltip": "The conv video VAE (ltx-2.5-video-vae-conv-bf16)."}),
            "latent": ("LATENT", {"tooltip": "Video latent [B, 128, F', H/32, W/32] from the sampler."}),
            **TILING_INPUTS}}

    def decode(self, video_vae, latent, tiling, spatial_tile, spatial_overlap, temporal_tile, temporal_overlap):
        from ..ltx.decode.conv_vae import decode_conv, decode_plan
        samples = latent_for_decoder(NODE, video_vae, latent, "conv", "ltx-2.5-video-vae-conv-bf16.safetensors",
                                     "LTX-2.5 Diffusion VAE Decode")
        request = TilingRequest(tiling, spatial_tile, spatial_overlap, temporal_tile, temporal_overlap)
        # Ask model management for room to decode untiled (evicting the sampler's models); auto then tiles only
        # if even that much is not free.
        estimate = decode_plan(video_vae.module, tuple(samples.shape),
                               request if tiling == "manual" else TilingRequest("off"), None).estimate_bytes
        vae = video_vae.ready(estimate)
        images, stats = decode_conv(vae, samples, request, bridge.free_device_memory(),
                                    bridge.step_callback(1, "conv VAE decode"), where=NODE)
        # The ui entry carries the figures the canvas shows on the node (web/ltx25_ab_viewer.js).
        return {"ui": {"ltx25_decode_stats": [stats.as_dict()]},
                "result": (images.to(bridge.intermediate_device()), stats)}


NODE_CLASS_MAPPINGS = {NODE: LTX25ConvVAEDecode}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Conv VAE Decode"}
