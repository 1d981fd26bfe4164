"""The LTX-2.5 latent grids, the one place their factors live (docs/MODEL.md §6): pure functions of plain numbers.

Video latent `[B, 128, F', H/32, W/32]`: one latent cell is 32 × 32 pixels (patch 4 × three ×2 spatial upsamples)
and the video VAE is causal in time, so the FIRST latent frame encodes one pixel frame and every later one eight:
F = 8(F' − 1) + 1. Audio latent `[B, 8, T, 16]`: 25 latents per second (16 kHz / hop 160 / 4 mel frames).
Both video decoders, the DiT's positions and the node checks read these numbers from here.
"""
from __future__ import annotations

VIDEO_CHANNELS = 128
SPATIAL_COMPRESSION = 32       # pixels per latent cell along height and width
TEMPORAL_COMPRESSION = 8       # pixel frames per latent frame after the first (which is one frame)
VIDEO_FACTORS = (TEMPORAL_COMPRESSION, SPATIAL_COMPRESSION, SPATIAL_COMPRESSION)  # (frames, rows, columns) per cell
AUDIO_CHANNELS = 8
AUDIO_BINS = 16
AUDIO_LATENTS_PER_SECOND = 25  # 16000 Hz / hop 160 / 4 mel frames per latent


def latent_frames(frames: int) -> int:
    """Pixel frames (8k + 1) → latent frames (k + 1)."""
    return (frames - 1) // TEMPORAL_COMPRESSION + 1


def pixel_frames(latent_frames_: int) -> int:
    """Latent frames F' → the F = 8(F'−1)+1 pixel frames a decoder makes (the inverse of `latent_frames`)."""
    return (latent_frames_ - 1) * TEMPORAL_COMPRESSION + 1


def pixel_shape(latent_fhw: tuple[int, int, int]) -> tuple[int, int, int]:
    """Latent (F', H', W') → decoded video (F, H, W) = (8(F'−1)+1, 32H', 32W')."""
    f, h, w = latent_fhw
    return pixel_frames(f), h * SPATIAL_COMPRESSION, w * SPATIAL_COMPRESSION


def video_latent_shape(width: int, height: int, frames: int, batch: int = 1) -> tuple[int, int, int, int, int]:
    """`[B, 128, F', H/32, W/32]` for a video of `frames` × `height` × `width` pixels (sizes already checked)."""
    return (batch, VIDEO_CHANNELS, latent_frames(frames), height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION)


def audio_latent_frames(frames: int, fps: float) -> int:
    """`round(frames / fps · 25)` — `round`, not `ceil` (docs/MODEL.md §6; 121 f @ 24 fps → 126)."""
    return round(frames / fps * AUDIO_LATENTS_PER_SECOND)


def audio_latent_shape(frames: int, fps: float, batch: int = 1) -> tuple[int, int, int, int]:
    """`[B, 8, T, 16]` for `frames` pixel frames at `fps`."""
    return (batch, AUDIO_CHANNELS, audio_latent_frames(frames, fps), AUDIO_BINS)
