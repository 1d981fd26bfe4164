"""The tiling widgets of both video-decode nodes and of the video-encode node: the same names and meanings on each
(the engine's `TilingRequest`), only the defaults differ per model."""
from __future__ import annotations

from typing import Callable

import torch

from . import bridge
from .handles import Loaded
from ..ltx.decode.tiling import MAX_WORK_TO_KEEP_LOADED, MODES, TilingRequest, working_memory_request


def tiling_inputs(tile_frames: int, tile_pixels: int, overlap_frames: int, overlap_pixels: int,
                  overlap_note: str, work: str = "decode", model: str = "decoder", keeps_loaded: bool = False) -> dict:
    """The tiling widget group with one model's defaults; `overlap_note` ends the overlap tooltips with what that
    model does with an overlap; `work` / `model` name the job and the model in the tooltips; `keeps_loaded`: the
    node tiles beside the loaded models rather than evicting them (`ready_to_decode`)."""
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
            f"auto tiling: GiB the {work} may use, the {model}'s weights included. 0 = the free device memory " + (
                f"(other models are evicted for an untiled decode, unless tiles that fit beside them do at most "
                f"{MAX_WORK_TO_KEEP_LOADED:g} times its work)." if keeps_loaded else
                "after other models are evicted."))}),
    }


def ready_to_decode(video_vae: Loaded, request: TilingRequest, untiled: int,
                    tiled_within: Callable[[int], tuple[int, float] | None]) -> tuple[torch.nn.Module, int]:
    """Load a video decoder for a decode whose untiled working memory is `untiled` bytes: room for it is made by
    evicting other models, or tiles that fit beside them are planned instead (`working_memory_request`; the
    decoder's `tiles_within`). Returns the module and the free memory its auto tiling plans within: what is free
    now, or for tiles chosen to fit beside the loaded models, no more than the memory they were chosen for (the
    free memory also holds model management's reserve)."""
    spare = video_vae.spare_memory()
    memory = working_memory_request(request, untiled, spare, tiled_within)
    module = video_vae.ready(memory)
    free = bridge.free_device_memory()
    return module, (free if memory >= untiled else min(free, spare))
