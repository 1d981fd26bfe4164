"""Conditioning a sampling stage on given latents (docs/MODEL.md §16): image-to-video, keyframes, first–last frame,
audio-to-video and the window of an extended clip, as Lightricks' ltx-core conditioning items do it, at the latent
level (the latents come from the VAE encoders, or from an earlier clip).

`Guides` (the LTX25_GUIDES value) lists what a stage is conditioned on; `resolve` turns it, for one stage's latents,
into a `GuidedStage`: the clean values the conditioned tokens keep, the per-token denoise mask, every token's position
and keyframe mark, and which streams are held whole. The samplers take it from there:
- noising: `x = lerp(clean, lerp(x, noise, σ_0), mask)` — a token with mask 0 starts at its clean value;
- each forward: per-token timesteps `σ · mask` (a held token sees t = 0, one at strength s sees σ·(1 − s)); a stream
  held whole is "frozen": its σ is 0 where the DiT uses a stream's σ (its prompt AdaLN, the other stream's AV gate);
- each step: `x0 ← x0 · mask + clean · (1 − mask)` before stepping (the reference's `post_process_latent`); the
  ancestral and res_2s steppers blend their re-noised latent the same way;
- the end: appended guide frames are cropped off before the latents leave the sampler.

Video guides (`VideoGuide`) at a pixel frame, with a strength in [0, 1] (1: held exactly; 0: a free token):
- 'replace' (ltx-core `VideoConditionByLatentIndex`): the guide's latent frames take the place of the clip's at the
  latent index of the frame; their positions and keyframe mark stay the clip's;
- 'append' (ltx-core `VideoConditionByKeyframeIndex`): the guide's tokens are appended after the clip's, positioned
  at the frame (a one-frame guide spans `[frame, frame + 1)`, the causal fix only at frame 0), never keyframe-marked;
  appending whole latent frames after the clip's is appending their tokens after the clip's (patchify order f, h, w);
- 'auto' (the reference's `combined_image_conditionings`): replace at frame 0, append anywhere else.
Audio guides (`AudioGuide`) replace audio latents from an index (ltx-core's latent-index rule on the audio tokens).
IC-LoRA reference videos (`ReferenceGuide`, ltx-core `VideoConditionByReferenceLatent`) are appended like guides, at
1/s of the clip's latent grid, their positions stretched back onto the clip's by the IC-LoRA's scale factors
(`reference_position_bounds`); an attention strength or mask (ltx-core `ConditioningItemAttentionStrengthWrapper`)
gives the stage an `AttentionLayout` for the DiT's video self-attention (reference_attention.py). Appended pieces of
another grid than the clip's make the extended latent one row of tokens, `[B, 128, 1, 1, N]` (what the DiT sees is
the token sequence either way; see `GuidedStage`).

Frame → latent index (the video VAE is causal): pixel frame 0 ↔ latent 0; pixel frames 8k−7 … 8k ↔ latent k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Union

import torch

from ..errors import LTX25Error
from ..geometry import (AUDIO_BINS, AUDIO_CHANNELS, AUDIO_LATENTS_PER_SECOND, SPATIAL_COMPRESSION,
                        TEMPORAL_COMPRESSION, VIDEO_CHANNELS, audio_latent_frames, pixel_frames)
from .positions import (VIDEO_SCALE, audio_position_bounds, first_frame_keyframes_mask, latent_pixel_bounds,
                        patchify_audio, patchify_video, video_position_bounds)
from .reference_attention import AttentionLayout, check_attention_strength, reference_weights

VIDEO_MODES = ("auto", "replace", "append")


class StageGrid(NamedTuple):
    """The latent grid of one stage: what a guide provider encodes its image or audio for."""
    batch: int
    frames: int          # F': the clip's latent frames (appended guides not counted)
    height: int          # H' (pixel height / 32)
    width: int           # W'
    audio_frames: int    # T
    fps: float
    video_offset: int = 0  # latent frames of an earlier clip before this window (extend), else 0
    audio_offset: int = 0

    @property
    def pixel_height(self) -> int:
        return self.height * SPATIAL_COMPRESSION

    @property
    def pixel_width(self) -> int:
        return self.width * SPATIAL_COMPRESSION

    @property
    def first_frame(self) -> int:
        """The first pixel frame this stage's latents cover (0 unless the stage is a window of a longer clip)."""
        return latent_span(self.video_offset)[0]

    @property
    def last_frame(self) -> int:
        """The last pixel frame this stage's latents cover."""
        return latent_span(self.video_offset + self.frames - 1)[1]


# A guide's latent: the tensor, or a callable that makes it for a stage's grid (e.g. encode an image at that size).
GuideLatent = Union[torch.Tensor, Callable[[StageGrid], torch.Tensor]]
# A reference's attention mask: weights in [0, 1], one per reference token (`[f·h·w]` or `[f, h, w]`), or a callable
# making them for a stage's grid and the reference latent's (f, h, w) there (e.g. resize a mask video).
ReferenceMask = Union[torch.Tensor, Callable[[StageGrid, tuple[int, int, int]], torch.Tensor]]


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class VideoGuide:
    """A normalized video latent `[1 or B, 128, f, H', W']` placed at pixel `frame` (negative: from the end, −1 is
    the last frame) with `strength` (1 held exactly, 0 free); `mode` one of `VIDEO_MODES`."""
    latent: GuideLatent
    frame: int = 0
    strength: float = 1.0
    mode: str = "auto"


@dataclass(frozen=True, eq=False)
class AudioGuide:
    """A normalized audio latent `[1 or B, 8, t, 16]` held from audio latent index `start` with `strength`."""
    latent: GuideLatent
    start: int = 0
    strength: float = 1.0


@dataclass(frozen=True, eq=False)
class ReferenceGuide:
    """An IC-LoRA reference video: a normalized latent `[1 or B, 128, f, H'/spatial, W'/spatial]` (its frames taken
    as frame 0, then every `temporal`-th), appended after the clip's tokens with `strength`; `spatial` and `temporal`
    are the IC-LoRA's `ReferenceScales`. `attention_strength` (in [0, 1]) times `attention_mask` (None: 1 everywhere)
    weighs the attention between the clip's tokens and the reference's (reference_attention.py); at 1 without a mask
    the DiT runs unmasked."""
    latent: GuideLatent
    strength: float = 1.0
    spatial: int = 1
    temporal: int = 1
    attention_strength: float = 1.0
    attention_mask: ReferenceMask | None = None


@dataclass(frozen=True, eq=False)
class Guides:
    """LTX25_GUIDES: what a stage is conditioned on. `video_offset`/`audio_offset`: the stage's latents are a window
    of a longer clip starting at these latent indices (extend.py); positions and frame indices are that clip's."""
    video: tuple[VideoGuide, ...] = ()
    audio: tuple[AudioGuide, ...] = ()
    video_offset: int = 0
    audio_offset: int = 0
    reference: tuple[ReferenceGuide, ...] = ()

    def __add__(self, other: "Guides") -> "Guides":
        """Both lists of guides (applied in order: a later replace wins where two overlap)."""
        if (self.video_offset, self.audio_offset) != (other.video_offset, other.audio_offset) and \
                (self.video_offset or self.audio_offset) and (other.video_offset or other.audio_offset):
            raise LTX25Error("guides", "the windows of the two guide sets",
                             f"{(self.video_offset, self.audio_offset)} and {(other.video_offset, other.audio_offset)}",
                             "the same window", "Guides for an extended clip belong to that clip's window.")
        return Guides(self.video + other.video, self.audio + other.audio,
                      max(self.video_offset, other.video_offset), max(self.audio_offset, other.audio_offset),
                      self.reference + other.reference)


# ---------------------------------------------------------------------------------------------------- frame mapping
def latent_index(frame: int) -> int:
    """The latent frame holding pixel `frame` (≥ 0): 0 → 0; 8k−7 … 8k → k (the first latent frame is one pixel
    frame, every later one eight)."""
    return 0 if frame <= 0 else (frame + TEMPORAL_COMPRESSION - 1) // TEMPORAL_COMPRESSION


def latent_span(index: int) -> tuple[int, int]:
    """The first and last pixel frame latent frame `index` holds: (0, 0) for 0, (8k−7, 8k) for k ≥ 1."""
    if index == 0:
        return 0, 0
    return TEMPORAL_COMPRESSION * index - TEMPORAL_COMPRESSION + 1, TEMPORAL_COMPRESSION * index


def window_audio_frames(grid: StageGrid) -> int:
    """The audio latents that go with the stage's video: `round(frames / fps · 25)` of the clip the window ends,
    minus those before the window."""
    return audio_latent_frames(pixel_frames(grid.video_offset + grid.frames), grid.fps) - grid.audio_offset


def guide_position_bounds(batch: int, frames: int, height: int, width: int, frame: int, fps: float,
                          device: torch.device | str | None = None) -> torch.Tensor:
    """`[B, 3, f·H'·W', 2]` positions of an appended guide of `frames` latent frames at pixel `frame` (ltx-core
    `VideoConditionByKeyframeIndex`): its own latent grid `[8j, 8j+8)`, causal-fixed only when `frame` is 0, shifted
    by `frame`; a guide of one pixel frame spans `[frame, frame + 1)`; time then in seconds."""
    st = VIDEO_SCALE[0]
    bounds = latent_pixel_bounds(frames, height, width, 0, device)
    if frame == 0:
        bounds[0] = (bounds[0] + 1 - st).clamp(min=0)
    bounds[0] += frame
    if pixel_frames(frames) == 1:
        bounds[0, :, 1] = bounds[0, :, 0] + 1
    bounds[0] /= fps
    return bounds.unsqueeze(0).expand(batch, -1, -1, -1)


def reference_position_bounds(batch: int, frames: int, height: int, width: int, fps: float, spatial: int = 1,
                              temporal: int = 1, device: torch.device | str | None = None) -> torch.Tensor:
    """`[B, 3, f·h·w, 2]` positions of an IC-LoRA reference latent of `frames` × `height` × `width` cells (ltx-core
    `VideoConditionByReferenceLatent`): its own grid as the start of a clip (causal fix), its frames `temporal` of the
    clip's apart — time divided by `fps / temporal`, then moved back by `temporal − 1` clip frames (its first frame's
    end, 1/fps, scaled) and clamped at 0, so its first frame spans the clip's `[0, 1/fps)` and latent j ends where
    clip frame `8·j·temporal` ends — and its pixels `spatial` times larger, each cell covering `spatial`² of the
    clip's cells."""
    st = VIDEO_SCALE[0]
    bounds = latent_pixel_bounds(frames, height, width, 0, device)
    bounds[0] = (bounds[0] + 1 - st).clamp(min=0) / (fps / temporal)
    if temporal != 1:
        first_end = (torch.ones((), device=device) / fps)  # the clip's first frame ends at 1/fps (float32, as its)
        bounds[0] = (bounds[0] - (temporal - 1) * first_end).clamp(min=0)
    if spatial != 1:
        bounds[1:] *= spatial
    return bounds.unsqueeze(0).expand(batch, -1, -1, -1)


# ---------------------------------------------------------------------------------------------------- one stage
class Grid(NamedTuple):
    """Per-stage DiT inputs that do not change between steps (transformer.Grid's fields)."""
    video_coords: torch.Tensor  # [B, 3, N, 2]
    audio_coords: torch.Tensor  # [B, 1, T, 2]
    keyframes: torch.Tensor     # [B, N, 1]


class Timesteps(NamedTuple):
    """One forward's timesteps in σ units (float32): per token σ·mask (`[B, N]`/`[B, T]`, or `[B, 1]` when every
    token of the stream has the same), and each stream's own σ `[B]` (0 for a frozen stream)."""
    video: torch.Tensor
    audio: torch.Tensor
    video_sigma: torch.Tensor
    audio_sigma: torch.Tensor


def uniform_timesteps(sigma: torch.Tensor) -> Timesteps:
    """Every token of both streams at `sigma` `[B]` (text-to-video)."""
    return Timesteps(sigma[:, None], sigma[:, None], sigma, sigma)


@dataclass(frozen=True, eq=False)
class GuidedStage:
    """One stage's conditioning, resolved for its latents (`resolve`). Video tensors cover the clip's F frames then
    the appended guides' K: clean `[B, 128, F+K, H', W']` and mask `[B, 1, F+K, H', W']` float32; audio clean
    `[B, 8, T, 16]`, mask `[B, 1, T, 1]`. mask = 1 − strength on conditioned cells, 1 elsewhere. When an appended
    piece has another grid than the clip's (an IC-LoRA reference at 1/s size), the video tensors are the token
    sequence as one row, `[B, C, 1, 1, F·H'·W' + appended tokens]`: the DiT, the noise, the blends and the memory
    estimate see tokens, so nothing else changes; `clip_grid` (H', W') tells `crop` how to lay the clip out again."""
    video_clean: torch.Tensor
    video_mask: torch.Tensor
    audio_clean: torch.Tensor
    audio_mask: torch.Tensor
    grid: Grid
    frames: int            # F: the output is cropped to these latent frames
    video_frozen: bool     # every video token held (mask 0)
    audio_frozen: bool     # every audio token held: audio-to-video
    offsets: tuple[int, int] = (0, 0)
    clip_grid: tuple[int, int] | None = None  # the clip's (H', W'); None: the video tensors' own
    attention: AttentionLayout | None = None  # the video self-attention's weights (a reference's attention strength)
    _tokens: dict = field(default_factory=dict, repr=False)

    @property
    def flat(self) -> bool:
        """The video tensors are one row of tokens (an appended piece of another grid than the clip's)."""
        return self.clip_grid is not None and tuple(self.video_clean.shape[3:]) != tuple(self.clip_grid)

    @property
    def appended(self) -> int:
        """Latent frames of appended guides (K) of a stage in the clip's grid (a token-row stage has no frames)."""
        if self.flat:
            raise ValueError("a stage holding tokens of another grid counts appended tokens, not frames")
        return self.video_clean.shape[2] - self.frames

    @property
    def appended_tokens(self) -> int:
        """Tokens appended after the clip's (guides and references)."""
        h, w = self.clip_grid or self.video_clean.shape[3:]
        return self.video_clean[0, 0].numel() - self.frames * h * w

    def to(self, device: torch.device) -> "GuidedStage":
        move = lambda t: t.to(device)  # noqa: E731
        return GuidedStage(move(self.video_clean), move(self.video_mask), move(self.audio_clean),
                           move(self.audio_mask), Grid(*map(move, self.grid)), self.frames, self.video_frozen,
                           self.audio_frozen, self.offsets, self.clip_grid,
                           None if self.attention is None else self.attention.to(device))

    def attention_bias(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The video self-attention's additive bias `[T, T]` in `dtype` (`AttentionLayout.bias`), made once per dtype
        and device; None when no reference carries an attention strength or mask (the DiT then runs unmasked)."""
        if self.attention is None:
            return None
        key = ("attention", str(device), dtype)
        if key not in self._tokens:
            self._tokens[key] = self.attention.bias(dtype, device)
        return self._tokens[key]

    def extend(self, video: torch.Tensor) -> torch.Tensor:
        """The clip's latent `[B, 128, F, H', W']` with the appended pieces' slots (zeros, as the reference starts
        them) after it, in the layout of `video_clean`."""
        if not self.appended_tokens:
            return video
        b, c, _, h, w = video.shape
        if not self.flat:
            return torch.cat([video, video.new_zeros(b, c, self.appended, h, w)], dim=2)
        tokens = video.flatten(2)
        return torch.cat([tokens, tokens.new_zeros(b, c, self.appended_tokens)], dim=2)[:, :, None, None]

    def crop(self, video: torch.Tensor) -> torch.Tensor:
        """The clip's frames of an extended latent: appended guides and references never leave the sampler."""
        if not self.flat:
            return video[:, :, : self.frames]
        h, w = self.clip_grid
        return video.flatten(2)[:, :, : self.frames * h * w].unflatten(2, (self.frames, h, w))

    def noised(self, video: torch.Tensor, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After noising to σ_0: conditioned tokens moved back toward their clean values (`lerp(clean, x, mask)`)."""
        return (torch.lerp(self.video_clean, video.float(), self.video_mask).to(video.dtype),
                torch.lerp(self.audio_clean, audio.float(), self.audio_mask).to(audio.dtype))

    def hold(self, video: torch.Tensor, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's `post_process_latent` on both streams: `x · mask + clean · (1 − mask)`, computed in the
        wider of x's dtype and float32, returned in x's dtype."""
        return (_blend(video, self.video_mask, self.video_clean), _blend(audio, self.audio_mask, self.audio_clean))

    def timesteps(self, sigma: float, batch: int | None = None) -> Timesteps:
        """σ·mask per token for one forward; `batch` repeats the rows for a batched forward of several passes."""
        key = ("masks", str(self.video_mask.device))
        if key not in self._tokens:
            self._tokens[key] = (_per_token(patchify_video(self.video_mask)[..., 0]),
                                 _per_token(patchify_audio(self.audio_mask)[..., 0]))
        video, audio = self._tokens[key]
        b = video.shape[0]
        stream = lambda frozen: torch.full((b,), 0.0 if frozen else float(sigma), device=video.device)  # noqa: E731
        steps = Timesteps(video * float(sigma), audio * float(sigma), stream(self.video_frozen),
                          stream(self.audio_frozen))
        if batch is not None and batch != b:
            steps = Timesteps(*(t.repeat(batch // b, *([1] * (t.ndim - 1))) for t in steps))
        return steps

    def token_sigmas(self, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
        """σ·mask in the latent layouts (`[B, 1, F+K, H', W']`, `[B, 1, T, 1]`): what x0 = x − v·t multiplies by."""
        return self.video_mask * float(sigma), self.audio_mask * float(sigma)

    def check_latents(self, video: torch.Tensor, audio: torch.Tensor, where: str = "denoise") -> None:
        """The latents a denoiser gets carry the appended slots (`extend`), at the resolved size."""
        for what, got, want in (("video", video.shape, self.video_clean.shape),
                                ("audio", audio.shape, self.audio_clean.shape)):
            if tuple(got) != tuple(want):
                raise LTX25Error(where, f"the {what} latent shape", list(got), f"{list(want)} (the guided stage's)",
                                 "The guides were resolved for other latents.")


def _per_token(mask: torch.Tensor) -> torch.Tensor:
    """`[B, N]` token mask, or `[B, 1]` where each clip's tokens share one value: the DiT's AdaLN then runs once
    per clip instead of once per token (same numbers), as for text-to-video."""
    return mask[:, :1] if bool((mask == mask[:, :1]).all()) else mask


def _blend(x: torch.Tensor, mask: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    return (x * mask + clean * (1 - mask)).to(x.dtype)


# ---------------------------------------------------------------------------------------------------- resolving
def resolve(guides: Guides | None, video: torch.Tensor, audio: torch.Tensor, fps: float,
            where: str = "guides") -> GuidedStage | None:
    """`guides` for one stage's latents, video `[B, 128, F, H', W']` and audio `[B, 8, T, 16]` at `fps` → the
    `GuidedStage` the samplers take (None for no guides). Providers are called with the stage's `StageGrid`. Bad
    input (an index outside the clip, a strength outside [0, 1], a latent of another size, audio longer than the
    clip) raises LTX25Error naming `where` and the guide."""
    if guides is None:
        return None
    if not isinstance(guides, Guides):
        raise LTX25Error(where, "the value", type(guides).__name__, "LTX25_GUIDES (a Guides value)",
                         "Connect a guides output of an LTX-2.5 conditioning node.")
    if not guides.video and not guides.audio and not guides.reference and \
            not (guides.video_offset or guides.audio_offset):
        return None
    b, _, f, h, w = video.shape
    t = audio.shape[2]
    grid = StageGrid(b, f, h, w, t, float(fps), guides.video_offset, guides.audio_offset)
    if min(grid.video_offset, grid.audio_offset) < 0:
        raise LTX25Error(where, "the window offsets", (grid.video_offset, grid.audio_offset), "≥ 0")
    device = video.device
    video_clean = video.detach().float().clone()
    video_mask = torch.ones(b, 1, f, h, w, device=device)
    # (latent, mask, coords, attention weights or None)
    appended: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    for number, guide in enumerate(guides.video, 1):
        label = f"video guide {number}"
        latent = _latent(guide.latent, grid, where, label, 5, VIDEO_CHANNELS, (h, w), "H', W'", b, device)
        strength = _strength(guide.strength, where, label)
        frame = _frame(guide.frame, grid, where, label)
        mode = guide.mode
        if mode not in VIDEO_MODES:
            raise LTX25Error(where, f"{label}'s mode", repr(mode), " / ".join(VIDEO_MODES))
        if mode == "auto":
            mode = "replace" if frame == 0 else "append"
        count = latent.shape[2]
        if mode == "replace":
            start = latent_index(frame) - grid.video_offset
            if start + count > f:
                raise LTX25Error(where, f"{label} ({count} latent frames from latent index {start})",
                                 f"past the clip's {f} latent frames", f"at most {f - start} frames there",
                                 "Place it earlier or use mode 'append'.")
            video_clean[:, :, start:start + count] = latent
            video_mask[:, :, start:start + count] = 1.0 - strength
        else:
            coords = guide_position_bounds(b, count, h, w, frame, grid.fps, device)
            appended.append((latent, torch.full((b, 1, count, h, w), 1.0 - strength, device=device), coords, None))
    audio_clean = audio.detach().float().clone()
    audio_mask = torch.ones(b, 1, t, 1, device=device)
    for number, guide in enumerate(guides.audio, 1):
        label = f"audio guide {number}"
        latent = _latent(guide.latent, grid, where, label, 4, AUDIO_CHANNELS, (AUDIO_BINS,), "mel bins", b, device)
        strength = _strength(guide.strength, where, label)
        start, count = guide.start, latent.shape[2]
        if not (isinstance(start, int) and 0 <= start < t):
            raise LTX25Error(where, f"{label}'s start index", start, f"0 … {t - 1} (the clip's audio latents)")
        if start + count > t:
            seconds = lambda n: f"{n / AUDIO_LATENTS_PER_SECOND:.2f} s"  # noqa: E731
            raise LTX25Error(where, f"{label} ({count} latents, {seconds(count)}, from index {start})",
                             "longer than the clip", f"at most {t - start} latents ({seconds(t - start)})",
                             "Trim the audio, or make the clip longer (frames on Empty Latent).")
        audio_clean[:, :, start:start + count] = latent
        audio_mask[:, :, start:start + count] = 1.0 - strength
    for number, reference in enumerate(guides.reference, 1):  # after every guide, as the reference appends them
        appended.append(_reference(reference, grid, where, f"reference video {number}", device))
    video_coords = video_position_bounds(b, f, h, w, grid.fps, device, grid.video_offset)
    keyframes = first_frame_keyframes_mask(b, f, h, w, device, grid.video_offset)
    if appended:
        if all(a[0].shape[3:] == (h, w) for a in appended):
            video_clean = torch.cat([video_clean, *(a[0] for a in appended)], dim=2)
            video_mask = torch.cat([video_mask, *(a[1] for a in appended)], dim=2)
        else:  # another grid: one row of tokens (patchify order f, h, w within each piece)
            video_clean = torch.cat([video_clean.flatten(2), *(a[0].flatten(2) for a in appended)], 2)[:, :, None, None]
            video_mask = torch.cat([video_mask.flatten(2), *(a[1].flatten(2) for a in appended)], 2)[:, :, None, None]
        video_coords = torch.cat([video_coords, *(a[2] for a in appended)], dim=2)
        keyframes = torch.cat([keyframes, keyframes.new_zeros(b, video_coords.shape[2] - keyframes.shape[1], 1)],
                              dim=1)  # given guide content is never keyframe-marked (ltx-core mask_utils)
    attention = None
    if any(a[3] is not None for a in appended):
        attention = AttentionLayout(f * h * w, tuple((a[0].shape[2:].numel(), a[3]) for a in appended))
    stage_grid = Grid(video_coords, audio_position_bounds(b, t, device, grid.audio_offset), keyframes)
    return GuidedStage(video_clean, video_mask, audio_clean, audio_mask, stage_grid, f,
                       bool((video_mask == 0).all()), bool((audio_mask == 0).all()),
                       (grid.video_offset, grid.audio_offset), (h, w), attention)


def _reference(reference: ReferenceGuide, grid: StageGrid, where: str, label: str,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(latent, mask, positions, attention weights or None) of an IC-LoRA reference video appended to this stage's
    tokens."""
    spatial, temporal = reference.spatial, reference.temporal
    for what, value in (("spatial", spatial), ("temporal", temporal)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LTX25Error(where, f"{label}'s {what} scale", value, "a whole number ≥ 1 (the IC-LoRA's)")
    if grid.height % spatial or grid.width % spatial:
        raise LTX25Error(where, f"{label}: this stage's latent grid (H', W')", (grid.height, grid.width),
                         f"multiples of {spatial}, the IC-LoRA's reference scale",
                         f"The reference is encoded at 1/{spatial} of the stage's size, on the same 32-px grid: "
                         f"make the clip's width and height multiples of {64 * spatial} (stage 1 runs at half).")
    if grid.video_offset:
        raise LTX25Error(where, label, f"on a window from latent frame {grid.video_offset}", "a clip's start",
                         "A reference video conditions a clip from its first frame; extend the clip without it.")
    b, h, w = grid.batch, grid.height // spatial, grid.width // spatial
    latent = _latent(reference.latent, grid, where, label, 5, VIDEO_CHANNELS, (h, w), "H', W'", b, device)
    strength = _strength(reference.strength, where, label)
    count = latent.shape[2]
    coords = reference_position_bounds(b, count, h, w, grid.fps, spatial, temporal, device)
    attention = check_attention_strength(reference.attention_strength, where, f"{label}'s attention strength")
    mask = reference.attention_mask
    mask = mask(grid, (count, h, w)) if callable(mask) else mask
    weights = reference_weights(attention, mask, count * h * w, where, label)
    return latent, torch.full((b, 1, count, h, w), 1.0 - strength, device=device), coords, weights


def _latent(source: GuideLatent, grid: StageGrid, where: str, label: str, ndim: int, channels: int,
            tail: tuple[int, ...], tail_name: str, batch: int, device: torch.device) -> torch.Tensor:
    """The guide's latent for this stage (calling a provider), checked and broadcast to the batch, float32."""
    latent = source(grid) if callable(source) else source
    if not isinstance(latent, torch.Tensor) or latent.ndim != ndim or latent.shape[1] != channels \
            or latent.shape[2] < 1:
        shape = list(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
        layout = "[B, 128, f, H', W'] (a video latent)" if ndim == 5 else "[B, 8, t, 16] (an audio latent)"
        raise LTX25Error(where, f"{label}'s latent", shape, layout, "Guides take normalized LTX-2.5 latents.")
    if tuple(latent.shape[3:]) != tail:
        stage = f"{tail[1] * SPATIAL_COMPRESSION}×{tail[0] * SPATIAL_COMPRESSION} px" if ndim == 5 else "16 mel bins"
        raise LTX25Error(where, f"{label}'s latent {tail_name}", tuple(latent.shape[3:]),
                         f"{tail} (this stage's grid, {stage})",
                         "A guide must match the stage's size and aspect: the reference encodes each guide again at "
                         "every stage's size — give a latent made for this stage, or a provider that encodes at the "
                         "grid it is given." if ndim == 5 else "")
    if latent.shape[0] not in (1, batch):
        raise LTX25Error(where, f"{label}'s latent batch", latent.shape[0], f"1 or {batch} (the clip batch)")
    if not torch.isfinite(latent).all():
        raise LTX25Error(where, f"{label}'s latent", "not finite (NaN or inf)", "finite values")
    return latent.detach().to(device, torch.float32).expand(batch, *latent.shape[1:])


def _strength(value: float, where: str, label: str) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0):
        raise LTX25Error(where, f"{label}'s strength", value, "in [0, 1] (1: held exactly, 0: no conditioning)")
    return float(value)


def _frame(value: int, grid: StageGrid, where: str, label: str) -> int:
    """A pixel frame inside the stage's span; negative counts from its end (−1: the last frame)."""
    first, last = grid.first_frame, grid.last_frame
    frame = last + 1 + value if isinstance(value, int) and value < 0 else value
    if not isinstance(value, int) or not first <= frame <= last:
        raise LTX25Error(where, f"{label}'s frame index", value,
                         f"{first} … {last} (or −1 … −{last - first + 1} from the end)",
                         "Frame indices count pixel frames of the clip, starting at 0.")
    return frame
