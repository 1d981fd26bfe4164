"""The conv-VAE decode node: LTX-2.5's fast video decoder, with spatio-temporal tiling."""
from __future__ import annotations

from . import bridge
from .handles import latent_for_decoder
from .decode_tiling import ready_to_decode, tiling_inputs
from ..ltx.decode.tiling import TilingRequest
from ..ltx.device_memory import weight_bytes

CATEGORY = "LTX-2.5/decode"
NODE = "LTX25ConvVAEDecode"
# the reference's conv-VAE tiling: 768 px tiles with 64 px overlap, 80-frame tiles with 24 frames overlap
TILING_INPUTS = tiling_inputs(80, 768, 24, 64, "Larger hides seams better and costs more (temporal tiles also share "
                              "one more latent frame, whose causal first frame is dropped).", keeps_loaded=True)


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

    def decode(self, video_vae, latent, tiling, tile_frames, tile_pixels, overlap_frames, overlap_pixels,
               memory_budget_gb):
        from ..ltx.decode.conv_vae import decode_conv, tiles_within, working_memory
        samples = latent_for_decoder(NODE, video_vae, latent, "conv", "ltx-2.5-video-vae-conv-bf16.safetensors",
                                     "LTX-2.5 Diffusion VAE Decode")
        request = TilingRequest(tiling, tile_frames, tile_pixels, overlap_frames, overlap_pixels, memory_budget_gb)
        request.check(NODE, weight_bytes(video_vae.module))
        # Room to decode untiled, or tiles that fit beside the loaded models rather than evicting the sampler's
        # transformer; auto then plans within `free`.
        shape = tuple(samples.shape)
        vae, free = ready_to_decode(video_vae, request, working_memory(video_vae.module, shape, request),
                                    lambda budget: tiles_within(video_vae.module, shape, request, budget))
        images, stats = decode_conv(vae, samples, request, free,
                                    bridge.step_callback(1, "conv VAE decode"), where=NODE,
                                    check=bridge.check_interrupt, on_plan=bridge.show_on_node)
        # The ui entry carries the figures the canvas shows on the node (web/ltx25_ab_viewer.js).
        return {"ui": {"ltx25_decode_stats": [stats.as_dict()]},
                "result": (images.to(bridge.intermediate_device()), stats)}


NODE_CLASS_MAPPINGS = {NODE: LTX25ConvVAEDecode}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Conv VAE Decode"}
