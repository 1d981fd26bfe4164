"""Extending a clip at the latent level (docs/MODEL.md §16.5): sample a window that starts with the source clip's
last latent frames held, then join the window's new frames to the source.

The reference (ltx-pipelines v1.2.0) has no extend pipeline; its retake pipeline regenerates a time range of a clip
while every other token keeps its value and its own position. Extending is that, on a window: the window holds the
source's last `overlap` latent frames and the audio from the same moment on, and every token keeps the position it
has in the joined clip (guides.Guides' offsets). So the held frames are positioned as the 8-frame latents they are —
not as a causal first frame, which is how ComfyUI-LTXVideo's extend sampler has to place its overlap (it then drops
that reinterpreted first latent and cross-fades the rest). With the overlap held at strength 1 the window's first
`overlap` frames equal the source's bit for bit, so the join is a concatenation: the source, then the window's new
frames; the causal decoder sees one continuous latent, with no seam to blend.

Audio: the window's audio starts at the audio latent of the window's first pixel frame (`floor(seconds · 25)`), and
holds the source's audio from there to the source's end; the joined audio is `round(frames / fps · 25)` latents of
the joined clip, as for any clip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import LTX25Error
from ..geometry import AUDIO_LATENTS_PER_SECOND, TEMPORAL_COMPRESSION, audio_latent_frames, pixel_frames
from .guides import AudioGuide, Guides, VideoGuide, latent_span


@dataclass(frozen=True)
class ExtensionPlan:
    """Where a window sits in the joined clip (source latent frames, then `new_frames` more)."""
    overlap: int            # source latent frames held at the window's start
    new_frames: int         # latent frames the window adds after the source
    video_offset: int       # source latent frames before the window
    audio_offset: int       # source audio latents before the window
    source_frames: int      # F_s
    source_audio: int       # T_s
    window_audio: int       # audio latents of the window (to the joined clip's end)

    @property
    def window_frames(self) -> int:
        return self.overlap + self.new_frames


def plan_extension(source_video: tuple[int, ...], source_audio: tuple[int, ...], fps: float, new_frames: int,
                   overlap: int, where: str = "extend") -> ExtensionPlan:
    """The window that continues a clip of latents `source_video` `[B, 128, F_s, H', W']` / `source_audio`
    `[B, 8, T_s, 16]` at `fps` by `new_frames` pixel frames (a multiple of 8), holding its last `overlap` latent
    frames (1 … F_s)."""
    f_s, t_s = source_video[2], source_audio[2]
    if not (isinstance(new_frames, int) and new_frames > 0 and new_frames % TEMPORAL_COMPRESSION == 0):
        raise LTX25Error(f"{where}.new_frames", "the number of new frames", new_frames,
                         f"a positive multiple of {TEMPORAL_COMPRESSION} (each latent frame after the first is 8)")
    if not (isinstance(overlap, int) and 1 <= overlap <= f_s):
        raise LTX25Error(f"{where}.overlap", "the overlap", overlap, f"1 … {f_s} latent frames (the source's)")
    if t_s != audio_latent_frames(pixel_frames(f_s), fps):
        raise LTX25Error(f"{where}.audio", "the source audio length", t_s,
                         f"{audio_latent_frames(pixel_frames(f_s), fps)} for {pixel_frames(f_s)} frames at {fps} fps",
                         "The source's video and audio latents belong to different clips or frame rates.")
    video_offset, added = f_s - overlap, new_frames // TEMPORAL_COMPRESSION
    start_seconds = latent_span(video_offset)[0] / fps
    audio_offset = min(math.floor(start_seconds * AUDIO_LATENTS_PER_SECOND + 1e-9), t_s)
    total_audio = audio_latent_frames(pixel_frames(f_s + added), fps)
    return ExtensionPlan(overlap, added, video_offset, audio_offset, f_s, t_s, total_audio - audio_offset)


def extension_guides(source_video: torch.Tensor, source_audio: torch.Tensor, plan: ExtensionPlan,
                     strength: float = 1.0) -> Guides:
    """The window's guides: the source's last `overlap` latent frames replacing the window's first ones and the
    source's audio from the window's start, held with `strength`, in the joined clip's positions."""
    frame = latent_span(plan.video_offset)[0]
    return Guides(video=(VideoGuide(source_video[:, :, plan.video_offset:], frame, strength, "replace"),),
                  audio=(AudioGuide(source_audio[:, :, plan.audio_offset:], 0, strength),),
                  video_offset=plan.video_offset, audio_offset=plan.audio_offset)


def window_latents(source_video: torch.Tensor, source_audio: torch.Tensor,
                   plan: ExtensionPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero latents of the window's shapes (what a sampler starts from; the guides fill in the overlap)."""
    b, c, _, h, w = source_video.shape
    return (source_video.new_zeros(b, c, plan.window_frames, h, w),
            source_audio.new_zeros(b, source_audio.shape[1], plan.window_audio, source_audio.shape[3]))


def join_extension(source_video: torch.Tensor, source_audio: torch.Tensor, window_video: torch.Tensor,
                   window_audio: torch.Tensor, plan: ExtensionPlan,
                   where: str = "extend") -> tuple[torch.Tensor, torch.Tensor]:
    """The joined clip: the source's latents, then the window's frames after the overlap (video) and after the
    source's audio (audio). `[B, 128, F_s + n, H', W']`, `[B, 8, T_joined, 16]`."""
    if window_video.shape[2] != plan.window_frames or window_audio.shape[2] != plan.window_audio:
        raise LTX25Error(where, "the window's latent lengths", (window_video.shape[2], window_audio.shape[2]),
                         (plan.window_frames, plan.window_audio), "Join the window sampled for this plan.")
    if tuple(window_video.shape[3:]) != tuple(source_video.shape[3:]):
        raise LTX25Error(where, "the window's H', W'", tuple(window_video.shape[3:]), tuple(source_video.shape[3:]),
                         "The window must be sampled at the source's size.")
    video = torch.cat([source_video, window_video[:, :, plan.overlap:].to(source_video)], dim=2)
    audio = torch.cat([source_audio, window_audio[:, :, plan.source_audio - plan.audio_offset:].to(source_audio)],
                      dim=2)
    return video, audio
