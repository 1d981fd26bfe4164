"""H.264 pre-compression of conditioning images (docs/MODEL.md §17.4), with PyAV and numpy only (no torch).

LTX-2 was trained on video frames that had been through H.264; a clean still (a PNG, a render) conditions the model
on detail its training frames never had, a known cause of frozen image-to-video results. The reference therefore
encodes each conditioning image as a one-frame H.264 video at a CRF (`nodes.ltx.encode.image_prep.image_crf`: 18 for
LTX-2.5) and decodes it back before resizing and encoding it. This module does that the reference's way: libx264,
preset veryfast, yuv420p through PyAV's default conversion, an mp4 in memory; odd heights and widths lose their last
row / column (4:2:0 needs even sizes); CRF 0 means no re-compression.
"""
from __future__ import annotations

import io

import av
import numpy as np

from ..ltx.errors import LTX25Error

PRESET = "veryfast"
MAX_CRF = 51  # libx264's range for 8-bit video is 0–51


def compress_frame(rgb: np.ndarray, crf: int) -> np.ndarray:
    """One `[H, W, 3]` uint8 RGB image → the same image after a round trip through H.264 at `crf`, `[H', W', 3]`
    uint8 with H', W' = H, W cut down to even. Unchanged (the input itself) for CRF 0 or a side below 2 pixels."""
    if crf == 0 or min(rgb.shape[0], rgb.shape[1]) < 2:
        return rgb
    height, width = rgb.shape[0] // 2 * 2, rgb.shape[1] // 2 * 2
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=1, options={"crf": str(crf), "preset": PRESET})
        stream.height, stream.width = height, width
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb[:height, :width]), format="rgb24")
        container.mux(stream.encode(frame.reformat(format="yuv420p")))
        container.mux(stream.encode())  # flush the encoder's delayed frame
    buffer.seek(0)
    with av.open(buffer) as container:
        decoded = next(container.decode(video=0))
        return decoded.to_ndarray(format="rgb24")


def precompress(frames: np.ndarray, crf: int, where: str = "precompress") -> np.ndarray:
    """Frames `[N, H, W, 3]` float in [0, 1] (ComfyUI IMAGE values) → `[N, H', W', 3]` float32 after
    `compress_frame` each, at even H', W'. Values are rounded to 8 bits first (the reference compresses 8-bit
    images); CRF 0 returns them unchanged."""
    if isinstance(crf, bool) or not isinstance(crf, (int, np.integer)) or not 0 <= crf <= MAX_CRF:
        raise LTX25Error(f"{where}.crf", "crf", repr(crf), f"a whole number from 0 (off) to {MAX_CRF}")
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise LTX25Error(f"{where}.image", "the image's shape", list(frames.shape), "[N ≥ 1, H, W, 3] RGB frames")
    if crf == 0:
        return frames.astype(np.float32, copy=False)
    codes = (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    return np.stack([compress_frame(frame, int(crf)) for frame in codes]).astype(np.float32) / 255.0
