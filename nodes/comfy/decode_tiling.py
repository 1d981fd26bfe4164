"""The tiling widgets of both video-decode nodes and of the video-encode node: the same names and meanings on each
(the engine's `TilingRequest`), only the defaults differ per model."""
from __future__ import annotations

from ..ltx.decode.tiling import MODES


def tiling_inputs(tile_frames: int, tile_pixels: int, overlap_frames: int, overlap_pixels: int,
                  overlap_note: str, work: str = "decode", model: str = "decoder") -> dict:
    """The tiling widget group with one model's defaults; `overlap_note` ends the overlap tooltips with what that
    model does with an overlap; `work` / `model` name the job and the model in the tooltips."""
    return {
        "tiling": (list(MODES), {"default": "auto", "tooltip": (
            f"auto: tile only when the untiled {work} would not fit the memory budget, then the tiles with the least "
            f"recomputed overlap that fit (with the overlaps below). off: {work} in one piece. manual: the sizes "
            "below.")}),
        "tile_frames": ("INT", {"default": tile_frames, "min": 8, "max": 8192, "step": 8,
                                "tooltip": "Manual tiling: frames per temporal tile (a multiple of 8)."}),
        "tile_pixels": ("INT", {"default": tile_pixels, "min": 64, "max": 8192, "step": 32,
                                "tooltip": "Manual tiling: tile height and width in pixels (a multiple of 32)."}),
        "overlap_frames": ("INT", {"default": overlap_frames, "min": 0, "max": 2048, "step": 8, "tooltip": (
            "Frames cross-faded between temporal tiles (a multiple of 8). " + overlap_note)}),
        "overlap_pixels": ("INT", {"default": overlap_pixels, "min": 0, "max": 2048, "step": 32, "tooltip": (
            "Pixels cross-faded between neighbouring tiles (a multiple of 32). " + overlap_note)}),
        "memory_budget_gb": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 4096.0, "step": 0.5, "tooltip": (
            f"auto tiling: GiB the {work} may use, the {model}'s weights included. 0 = the free device memory "
            "after other models are evicted.")}),
    }
