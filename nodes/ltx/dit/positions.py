"""Token layout and RoPE positions of the LTX-2.5 DiT (docs/MODEL.md §5.4, §6): patchify/unpatchify both streams, the
per-token position bounds the rotary embeddings are computed from, and the keyframe marker mask.

Positions are `[start, end)` bounds per token; the DiT's RoPE (diffusers `LTX2AudioVideoRotaryPosEmbed`, with
`use_middle_indices_grid`) takes the midpoint of each pair. Video time is in SECONDS (pixel-frame bounds divided by
fps), height/width in pixels; audio time in seconds of mel frames. All bounds are float32 — they are small integers
or exact fractions, so float32 holds them the way the reference's `.float()` does.
"""
from __future__ import annotations

import torch

from ..geometry import VIDEO_FACTORS

# Fixed by the VAEs, not by the transformer config: video latent cell = 8 frames × 32 × 32 pixels (the first
# latent frame holds ONE pixel frame: the encoder is causal); audio latent frame = 4 mel frames of 160 samples
# at 16 kHz.
VIDEO_SCALE = VIDEO_FACTORS
AUDIO_LATENT_DOWNSAMPLE = 4
MEL_HOP_LENGTH = 160
AUDIO_SAMPLE_RATE = 16000


def patchify_video(latent: torch.Tensor) -> torch.Tensor:
    """`[B, C, F, H, W]` → tokens `[B, F·H·W, C]` in (f, h, w) order (patch size 1)."""
    return latent.flatten(2).transpose(1, 2)


def unpatchify_video(tokens: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Tokens `[B, F·H·W, C]` → `[B, C, F, H, W]` for `shape` = (B, C, F, H, W)."""
    return tokens.transpose(1, 2).reshape(shape)


def patchify_audio(latent: torch.Tensor) -> torch.Tensor:
    """`[B, C, T, M]` → tokens `[B, T, C·M]`: channel-major, mel-minor ((c f) flatten)."""
    b, c, t, m = latent.shape
    return latent.transpose(1, 2).reshape(b, t, c * m)


def unpatchify_audio(tokens: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Tokens `[B, T, C·M]` → `[B, C, T, M]` for `shape` = (B, C, T, M)."""
    b, c, t, m = shape
    return tokens.reshape(b, t, c, m).transpose(1, 2)


def latent_pixel_bounds(frames: int, height: int, width: int, frame_offset: int = 0,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """`[3, F·H·W, 2]` pixel bounds (frames, rows, columns) of latent cells `[8f, 8f+8) × [32h, 32h+32) × …`, tokens
    in (f, h, w) order, f counted from `frame_offset`; no causal fix, not in seconds (the callers apply those)."""
    st, sh, sw = VIDEO_SCALE
    f, h, w = torch.meshgrid(torch.arange(frame_offset, frame_offset + frames, device=device),
                             torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij")
    start = torch.stack([f, h, w]).flatten(1).float()                      # [3, N] latent index
    scale = torch.tensor([st, sh, sw], dtype=torch.float32, device=device)[:, None]
    return torch.stack([start * scale, (start + 1) * scale], dim=-1)       # [3, N, 2] pixel bounds


def video_position_bounds(batch: int, frames: int, height: int, width: int, fps: float,
                          device: torch.device | str | None = None, frame_offset: int = 0) -> torch.Tensor:
    """`[B, 3, F·H·W, 2]` bounds (time s, y px, x px) of every latent cell, tokens in (f, h, w) order.

    Time: pixel frames `[8f, 8f+8)` shifted by the causal fix `max(· + 1 − 8, 0)` (frame 0 → `[0, 1)`, frame f →
    `[8f−7, 8f+1)`), then divided by fps. Space: `[32h, 32h+32)`. `frame_offset` numbers the frames from there:
    the window of a longer clip (extend) keeps the positions its frames have in that clip.
    """
    st = VIDEO_SCALE[0]
    bounds = latent_pixel_bounds(frames, height, width, frame_offset, device)
    bounds[0] = (bounds[0] + 1 - st).clamp(min=0) / fps
    return bounds.unsqueeze(0).expand(batch, -1, -1, -1)


def audio_position_bounds(batch: int, frames: int, device: torch.device | str | None = None,
                          offset: int = 0) -> torch.Tensor:
    """`[B, 1, T, 2]` bounds in seconds of every audio latent frame: mel frames `max(4i−3, 0) … max(4i+1, 0)`
    (the same causal fix), times 160 / 16000 s; i counted from `offset` (a window of a longer clip)."""
    i = torch.arange(offset, offset + frames, dtype=torch.float32, device=device)
    mel = torch.stack([i, i + 1], dim=-1) * AUDIO_LATENT_DOWNSAMPLE
    seconds = (mel + 1 - AUDIO_LATENT_DOWNSAMPLE).clamp(min=0) * MEL_HOP_LENGTH / AUDIO_SAMPLE_RATE
    return seconds[None, None].expand(batch, -1, -1, -1)


def first_frame_keyframes_mask(batch: int, frames: int, height: int, width: int,
                               device: torch.device | str | None = None, frame_offset: int = 0) -> torch.Tensor:
    """`[B, F·H·W, 1]`: 1 on the first latent frame's tokens, 0 elsewhere.

    The first latent frame encodes a single pixel frame (causal encoder), the same token class as a generated
    keyframe slot, so the reference marks it unconditionally (ltx-core `_first_frame_keyframes_mask`); the 2.5 DiT
    adds `keyframes_abs_pos_embedding` to exactly these tokens. A window starting at `frame_offset` > 0 (extend)
    holds no first frame: nothing is marked.
    """
    mask = torch.zeros(batch, frames * height * width, 1, device=device)
    if frame_offset == 0:
        mask[:, : height * width] = 1.0
    return mask
