"""Preparing images for the video encoder (docs/MODEL.md §17.4): the reference's resize/crop rule onto the latent
grid, and its choice of the H.264 CRF an image is pre-compressed at before encoding (the compression itself needs
PyAV and lives in `nodes/media/crf.py`).

Order, as the reference prepares an image conditioning: pre-compress the image at its own size (cut to even
height and width), then `resize_crop` to the target, then encode. Video conditionings are resized the same way and
not pre-compressed.
"""
from __future__ import annotations

import math

import torch

from ..errors import LTX25Error
from ..files.assets import model_version_tuple
from ..geometry import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION

# The CRF the model was trained against is a property of its generation, read from the checkpoint's model_version:
# 33 up to LTX-2.3, 18 from 2.4 on — so 18 for every 2.5 file. An unversioned file gets 33, as in the reference.
IMAGE_CRF_BEFORE_2_4 = 33
IMAGE_CRF_FROM_2_4 = 18


def image_crf(model_version: str | None) -> int:
    """The CRF the reference pre-compresses image conditionings at for a checkpoint of `model_version` (the video
    VAE file's): 18 from 2.4 on (LTX-2.5: 18), 33 before and when the file carries no version."""
    return IMAGE_CRF_FROM_2_4 if model_version_tuple(model_version) >= (2, 4) else IMAGE_CRF_BEFORE_2_4


def resize_crop(frames: torch.Tensor, width: int, height: int, where: str = "resize_crop") -> torch.Tensor:
    """Frames `[..., H, W, 3]` (any leading axes) → `[..., height, width, 3]` float32, as the reference fits a
    conditioning image: scale by `max(height/H, width/W)` so the image COVERS the target (each side rounded up),
    bilinear (align_corners false, no antialiasing), then crop the centre (the odd pixel of an uneven margin comes
    off the bottom / right). No aspect distortion; what sticks out is cut. `width` and `height` must be multiples
    of 32 (the latent grid)."""
    for name, value in (("width", width), ("height", height)):
        if int(value) != value or value < SPATIAL_COMPRESSION or value % SPATIAL_COMPRESSION:
            lower = max(SPATIAL_COMPRESSION, int(value) // SPATIAL_COMPRESSION * SPATIAL_COMPRESSION)
            raise LTX25Error(f"{where}.{name}", name, value, f"a positive multiple of {SPATIAL_COMPRESSION} (one "
                             "latent cell)", f"Try {lower} or {lower + SPATIAL_COMPRESSION}.")
    if not isinstance(frames, torch.Tensor) or frames.ndim < 3 or frames.shape[-1] != 3 or 0 in frames.shape:
        found = list(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
        raise LTX25Error(f"{where}.image", "the image", found, "frames [..., H ≥ 1, W ≥ 1, 3]")
    src_h, src_w = frames.shape[-3], frames.shape[-2]
    lead = frames.shape[:-3]
    x = frames.reshape(-1, src_h, src_w, 3).float()
    if (src_h, src_w) != (height, width):
        # the reference's arithmetic to the letter (Python floats, ceil), so sizes agree with it pixel for pixel
        scale = max(height / src_h, width / src_w)
        new_h, new_w = math.ceil(src_h * scale), math.ceil(src_w * scale)
        x = torch.nn.functional.interpolate(x.permute(0, 3, 1, 2), size=(new_h, new_w), mode="bilinear",
                                            align_corners=False).permute(0, 2, 3, 1)
        top, left = (new_h - height) // 2, (new_w - width) // 2
        x = x[:, top:top + height, left:left + width]
    return x.reshape(*lead, height, width, 3).contiguous()


# ---------------------------------------------------------------------------------------------------- IC-LoRA videos
# An IC-LoRA reference video (docs/MODEL.md §16.7) is resized like an image to 1/spatial of the stage's size and,
# for an IC-LoRA trained on sparser frames, thinned in time; it is never pre-compressed.

def reference_frame_indices(count: int, clip_frames: int, temporal: int = 1) -> list[int]:
    """The frames of a `count`-frame reference video a clip of `clip_frames` uses: the first `clip_frames` at most
    (the reference caps the decode at the clip's length), then frame 0 and every `temporal`-th from frame 1 (so each
    later group of `temporal` frames is represented by its first, as the causal encoder groups frames)."""
    used = min(count, clip_frames)
    return [0, *range(1, used, temporal)] if used > 0 else []


def reference_clip_frames(count: int, temporal: int = 1) -> int:
    """The longest 8k+1 clip a `count`-frame reference covers whole: `8·temporal·k + 1` frames, whose thinned
    reference is 8k+1 frames (what the encoder takes); 1 for a reference too short for one latent step."""
    step = TEMPORAL_COMPRESSION * temporal
    return max(count - 1, 0) // step * step + 1


def crop_fraction(source_hw: tuple[int, int], target_hw: tuple[int, int]) -> float:
    """The share of the source's width or height that `resize_crop` cuts off to fit the target's aspect (0: same
    aspect)."""
    source, target = source_hw[1] / source_hw[0], target_hw[1] / target_hw[0]
    return 1.0 - min(source / target, target / source)
