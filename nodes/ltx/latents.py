"""Checks on LTX-2.5 latents (docs/MODEL.md §6) that turn a bad size into an error naming the node input, and the
per-channel (de)normalization. The grid's factors and shape functions live in `geometry`.

Video latent `[B, 128, F', H/32, W/32]` with `F' = (F - 1)/8 + 1` (F = 8k + 1 pixel frames: the first latent frame
encodes one frame, every later one eight). Audio latent `[B, 8, T, 16]` with `T = round(F / fps · 25)`: the audio VAE
makes 25 latents per second (16 kHz / hop 160 / 4), and the reference rounds, it does not ceil (§13 item 16).

Two-stage generation (stage 1 at half size → x2 latent upsampler → stage 2 at full size) needs the FINAL width and
height to be multiples of 64, so that the half-size stage-1 video is still a whole number of 32-px latent cells.
"""
from __future__ import annotations

from typing import Mapping

import torch

from .errors import LTX25Error
from .geometry import (AUDIO_BINS, AUDIO_CHANNELS, SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION, VIDEO_CHANNELS,
                       audio_latent_frames, audio_latent_shape, pixel_frames, video_latent_shape)

UPSAMPLE_FACTOR = 2            # the shipped spatial upscaler between the two stages


def check_video_size(width: int, height: int, frames: int, two_stage: bool = False,
                     where: str = "LTX25EmptyLatent") -> None:
    """Refuse a width/height/frame count the VAE grid cannot represent; `where` prefixes the input name."""
    multiple = SPATIAL_COMPRESSION * (UPSAMPLE_FACTOR if two_stage else 1)
    why = (f" (two_stage: stage 1 runs at half size, which must still be a multiple of {SPATIAL_COMPRESSION})"
           if two_stage else f" (one latent cell is {SPATIAL_COMPRESSION}×{SPATIAL_COMPRESSION} px)")
    for name, value in (("width", width), ("height", height)):
        if int(value) != value or value < multiple or value % multiple:
            lower = max(multiple, int(value) // multiple * multiple)
            raise LTX25Error(f"{where}.{name}", name, value, f"a positive multiple of {multiple}{why}",
                             f"Try {lower} or {lower + multiple}.")
    if int(frames) != frames or frames < 1 or (frames - 1) % TEMPORAL_COMPRESSION:
        lower = max(1, (int(frames) - 1) // TEMPORAL_COMPRESSION * TEMPORAL_COMPRESSION + 1)
        raise LTX25Error(f"{where}.frames", "frames", frames, "8k + 1 (1, 9, 17, …, 121, …)",
                         f"The video VAE packs 8 frames per latent after the first; try {lower} or "
                         f"{lower + TEMPORAL_COMPRESSION}.")


def check_fps_batch(fps: float, batch: int, where: str = "LTX25EmptyLatent") -> None:
    if not fps > 0:
        raise LTX25Error(f"{where}.fps", "fps", fps, "a frame rate > 0")
    if int(batch) != batch or batch < 1:
        raise LTX25Error(f"{where}.batch", "batch", batch, "an integer ≥ 1")


def empty_latent_shapes(width: int, height: int, frames: int, fps: float, batch: int = 1, two_stage: bool = True,
                        where: str = "LTX25EmptyLatent") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(video shape, audio shape) of the latents sampling starts from, after validating every input.

    `width`/`height` are the FINAL output size. With `two_stage` the video latent is the half-size stage-1 latent
    (the upsampler doubles it before stage 2), so `1536×1024 → [B,128,F',16,24]`; without it, the full size.
    """
    check_video_size(width, height, frames, two_stage, where)
    check_fps_batch(fps, batch, where)
    scale = UPSAMPLE_FACTOR if two_stage else 1
    return (video_latent_shape(width // scale, height // scale, frames, batch), audio_latent_shape(frames, fps, batch))


def check_latent_pair(video: torch.Tensor, audio: torch.Tensor, fps: float, where: str,
                      offsets: tuple[int, int] = (0, 0)) -> None:
    """A video latent `[B,128,F',H',W']` and an audio latent `[B,8,T,16]` that belong to the same clip at `fps`
    (with `offsets`: the window of a longer clip that starts at those video/audio latent indices, as extending one
    samples it: its audio runs to that clip's end)."""
    if video.ndim != 5 or video.shape[1] != VIDEO_CHANNELS:
        raise LTX25Error(f"{where}.video_latent", "the video latent shape", list(video.shape),
                         f"[B, {VIDEO_CHANNELS}, F', H', W']", "Connect a video latent from LTX-2.5 Empty Latent.")
    if audio.ndim != 4 or audio.shape[1] != AUDIO_CHANNELS or audio.shape[3] != AUDIO_BINS:
        raise LTX25Error(f"{where}.audio_latent", "the audio latent shape", list(audio.shape),
                         f"[B, {AUDIO_CHANNELS}, T, {AUDIO_BINS}]", "Connect the audio latent from LTX-2.5 Empty Latent.")
    check_not_empty(video, f"{where}.video_latent")
    if 0 in (audio.shape[0], audio.shape[2]):
        raise LTX25Error(f"{where}.audio_latent", "the audio latent shape", list(audio.shape),
                         f"[B ≥ 1, {AUDIO_CHANNELS}, T ≥ 1, {AUDIO_BINS}]", "Connect the audio latent from LTX-2.5 "
                         "Empty Latent.")
    if audio.shape[0] != video.shape[0]:
        raise LTX25Error(f"{where}.audio_latent", "the audio batch size", audio.shape[0],
                         f"{video.shape[0]} (the video latent's)", "Both latents must come from the same Empty Latent.")
    want = audio_latent_frames(pixel_frames(offsets[0] + video.shape[2]), fps) - offsets[1]
    if audio.shape[2] != want:
        window = f" (a window from latent {offsets[0]} of a longer clip)" if offsets[0] else ""
        raise LTX25Error(f"{where}.audio_latent", "the audio latent length", audio.shape[2],
                         f"{want} for {pixel_frames(video.shape[2])} frames at {fps} fps{window}",
                         "The audio and video latents belong to different clips or frame rates.")


def frame_rate(latent: Mapping, where: str, default: float | None = None) -> float:
    """The `frame_rate` LTX-2.5 Empty Latent stores in a LATENT dict (the DiT's time positions are in seconds), else
    `default`: core ComfyUI's empty LTXV latents carry none (core keeps the rate on its conditioning)."""
    fps = latent.get("frame_rate", default)
    if fps is None:
        raise LTX25Error(where, "the latent's 'frame_rate'", "missing", "the fps stored by LTX-2.5 Empty Latent",
                         "Start from LTX-2.5 Empty Latent: the model needs the frame rate of the clip.")
    if not float(fps) > 0:
        raise LTX25Error(where, "the latent's 'frame_rate'", fps, "a frame rate > 0")
    return float(fps)


VIDEO_STREAM, AUDIO_STREAM = 0, 1  # the order of core ComfyUI's joint audio+video latent


def unbind_av(samples: object, stream: int, where: str) -> object:
    """One stream of core ComfyUI's joint audio+video latent (a `NestedTensor` of [video, audio], as its Concat AV
    Latent node and its sampler make), unbound as core's own decoders do; any other `samples` is returned as is.
    Recognized by its `is_nested` flag and `unbind()`: the engine never imports ComfyUI."""
    if isinstance(samples, torch.Tensor) or not getattr(samples, "is_nested", False):
        return samples
    streams = list(samples.unbind())
    if len(streams) != 2:
        raise LTX25Error(where, "the nested latent's streams", len(streams), "2 (video, audio)",
                         "Split it with core's Separate AV Latent node and connect each stream on its own.")
    return streams[stream]


# Set by LTX-2.5 Empty Latent: True while the video latent is the half-size stage-1 latent that Latent Upsample
# still has to double; False once it is at the final size (two_stage off, or already upsampled).
HALF_SIZE_KEY = "ltx25_half_size"
# On a stage-1 sampler's video LATENT: the counts of values it drew to start (video with its appended pieces, audio),
# which stage 2 skips in the seed's stream as the reference's one generator does (sampling.initial_noise).
NOISE_DRAWN_KEY = "ltx25_noise_drawn"
# On an extension window's video LATENT (Extend Clip; the samplers keep it): the overlap it was made with, which Join
# Extension must use. Its shapes cannot tell: a window made with overlap 1 also joins with 2, one latent frame short.
EXTENSION_OVERLAP_KEY = "ltx25_extension_overlap"


def check_upsample_wanted(latent: Mapping, where: str) -> None:
    """Refuse to upsample a latent its Empty Latent already made full size: the output would be twice the size the
    graph asks for. Latents from elsewhere carry no mark and are not checked."""
    if latent.get(HALF_SIZE_KEY) is False:
        raise LTX25Error(where, "the video latent", "already at the final width×height (two_stage is off in "
                         "LTX-2.5 Empty Latent, or the latent was upsampled before)",
                         "the half-size stage-1 latent of a two_stage Empty Latent",
                         "Turn two_stage on in LTX-2.5 Empty Latent, or bypass this node and the stage-2 sampler "
                         "(Ctrl+B) to sample one stage at width×height.")


def check_stage2_wanted(latent: Mapping, where: str) -> None:
    """Refuse to run stage 2 on the half-size latent Latent Upsample did not double: it would refine a clip at half
    the width×height the graph asks for. Latents from elsewhere carry no mark and are not checked."""
    if latent.get(HALF_SIZE_KEY) is True:
        raise LTX25Error(where, "the video latent", "the half-size stage-1 latent of a two_stage Empty Latent",
                         "the latent at the final width×height, from LTX-2.5 Latent Upsample",
                         "Connect stage 1's video latent through LTX-2.5 Latent Upsample to this stage.")


def check_video_latent(samples: object, where: str) -> torch.Tensor:
    """A normalized LTX-2.5 video latent `[B, 128, F', H', W']`, or an error naming `where` (a node input)."""
    if not isinstance(samples, torch.Tensor):
        raise LTX25Error(where, "the latent 'samples'", type(samples).__name__, "a tensor [B, 128, F', H', W']",
                         "Connect a video LATENT from an LTX-2.5 sampler or Empty Latent.")
    if samples.ndim != 5:
        raise LTX25Error(where, "the latent shape", list(samples.shape), "[B, 128, F', H', W'] (a 5-D video latent)",
                         "An audio latent [B, 8, T, 16] goes to LTX-2.5 Audio Decode." if samples.ndim == 4 else "")
    if samples.shape[1] != VIDEO_CHANNELS:
        raise LTX25Error(where, "the latent channel count", samples.shape[1], f"{VIDEO_CHANNELS} (an LTX-2.5 video "
                         "latent)", "This latent comes from another model; only LTX-2.5 latents decode here.")
    check_not_empty(samples, where)
    return samples


def check_not_empty(samples: torch.Tensor, where: str) -> None:
    """A video latent with no batch item, no frame, or no row or column of cells is refused by name (torch kernels
    fail on it deep inside a model with messages that name neither the node nor the size)."""
    if 0 in samples.shape:
        raise LTX25Error(where, "the latent shape", list(samples.shape), "[B ≥ 1, 128, F' ≥ 1, H' ≥ 1, W' ≥ 1]",
                         "An empty latent has nothing to sample or decode: check the node that made it.")


def _per_channel(stat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return stat.to(like.device, torch.float32).view((1, -1) + (1,) * (like.ndim - 2))


def denormalize_video(latent: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                      device: torch.device) -> torch.Tensor:
    """Normalized video latent `[B, 128, F', H', W']` → the VAE's raw latent in float32 on `device`
    (`x·std + mean` per channel, with the file's per-channel statistics `[128]`)."""
    z = latent.to(device, torch.float32)
    return z * _per_channel(std, z) + _per_channel(mean, z)


def normalize_video(raw: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The inverse of `denormalize_video`, in float32 on `raw`'s device."""
    raw = raw.float()
    return (raw - _per_channel(mean, raw)) / _per_channel(std, raw)
