"""The attention strength of an IC-LoRA reference video (docs/MODEL.md §16.7): how much the clip's tokens and the
reference's tokens see each other in the DiT's video self-attention, as ltx-core's
`ConditioningItemAttentionStrengthWrapper` sets it.

Each reference token j carries a weight c_j in [0, 1] (the attention strength, times a mask video resized to the
reference's latent grid). Once any appended piece carries weights, the video self-attention gets a `[T, T]` matrix W
of multiplicative weights, applied as the additive bias `log W` (`finfo(dtype).min` where W is 0) before the
softmax, so a query's attention to key k is proportional to `W[q, k] · exp(q·k/√d)`:
- clip ↔ reference token j (both directions): c_j;
- a weighted piece ↔ any piece appended before it, and a later piece ↔ it: 0 (appended pieces do not see each
  other once the matrix exists; pieces appended before the first weighted one keep seeing each other);
- everything else (clip ↔ clip, a piece ↔ itself, clip ↔ an unweighted piece): 1.
Without any weights there is no matrix and the attention is the plain one. Only the video self-attention is biased:
text cross-attention and the audio↔video cross-attentions see every video token as before (so at strength 0 the
clip still differs from a run without the reference: the audio attends to the reference's tokens).

The bias reaches the attention through the module's own diffusers processor, as its `attention_mask`, for the
duration of one forward (`biased_video_self_attention`), the way perturbation.py installs its processors.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import LTX25Error

# torch's memory-efficient SDPA copies a mask whose rows are not 8-element aligned into a padded [B, H, T, T] tensor
# (`preprocess_mask`); the bias is stored with rows of a multiple of this many elements so the broadcast view stays
# a view.
ROW_ALIGNMENT = 16


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class AttentionLayout:
    """The video token sequence of a guided stage for its self-attention weights: `noisy` clip tokens, then the
    appended pieces in order, each `(tokens, weights)` — weights `[tokens]` float32 in [0, 1] for a reference with an
    attention strength or mask, None for a piece without (a guide frame, a reference at strength 1)."""
    noisy: int
    pieces: tuple[tuple[int, torch.Tensor | None], ...]

    @property
    def tokens(self) -> int:
        return self.noisy + sum(count for count, _ in self.pieces)

    def to(self, device: torch.device) -> "AttentionLayout":
        return AttentionLayout(self.noisy, tuple((n, None if w is None else w.to(device)) for n, w in self.pieces))

    def bias(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The additive bias `[T, T]` in `dtype` (log of the weights, `finfo(dtype).min` for 0), rows stored
        `ROW_ALIGNMENT`-aligned (a column slice of a wider tensor)."""
        total, low = self.tokens, torch.finfo(dtype).min
        width = -(-total // ROW_ALIGNMENT) * ROW_ALIGNMENT
        bias = torch.zeros(total, width, dtype=dtype, device=device)[:, :total]
        first = next((i for i, (_, w) in enumerate(self.pieces) if w is not None), len(self.pieces))
        start = self.noisy + sum(count for count, _ in self.pieces[:first])
        for count, weights in self.pieces[first:]:
            end = start + count
            bias[start:end, self.noisy:start] = low
            bias[self.noisy:start, start:end] = low
            if weights is not None:
                log = log_weights(weights.to(device), dtype)
                bias[start:end, :self.noisy] = log[:, None]
                bias[:self.noisy, start:end] = log[None, :]
            start = end
        return bias


def log_weights(weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Multiplicative attention weights in [0, 1] → additive bias in `dtype`: log(w), the dtype's lowest finite value
    for 0 (ltx-core's choice: −inf would turn a fully masked row into NaN). The log is taken in float32."""
    weights = weights.float()
    log = weights.clamp(min=torch.finfo(torch.float32).tiny).log().to(dtype)
    return torch.where(weights > 0, log, torch.full_like(log, torch.finfo(dtype).min))


def check_attention_strength(value: float, where: str, what: str = "the attention strength") -> float:
    """An attention strength as a float in [0, 1], or an LTX25Error naming `where`."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1):
        raise LTX25Error(where, what, value, "in [0, 1] (1: full attention between the clip and the reference, as "
                         "trained; 0: none)")
    return float(value)


def reference_weights(strength: float, mask: torch.Tensor | None, tokens: int, where: str,
                      label: str) -> torch.Tensor | None:
    """A reference's per-token weights `[tokens]` float32: `mask · strength` (mask `[tokens]` or `[f, h, w]`, in
    [0, 1]), `strength` everywhere without a mask, None at strength 1 without a mask (no matrix is made then)."""
    if mask is None:
        return None if strength == 1.0 else torch.full((tokens,), float(strength))
    if not isinstance(mask, torch.Tensor) or mask.numel() != tokens or mask.ndim not in (1, 3):
        found = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise LTX25Error(where, f"{label}'s attention mask", found,
                         f"{tokens} weights (one per reference token, [f·h·w] or [f, h, w])",
                         "The mask is made for the reference's latent grid at this stage.")
    mask = mask.detach().float().flatten().cpu()
    if not torch.isfinite(mask).all() or mask.min() < 0 or mask.max() > 1:
        raise LTX25Error(where, f"{label}'s attention mask", f"in [{mask.min():.3g}, {mask.max():.3g}]",
                         "finite values in [0, 1]")
    return mask * float(strength)


def mask_video_tokens(mask: torch.Tensor, stage_hw: tuple[int, int], latent_fhw: tuple[int, int, int],
                      clip_frames: int, where: str) -> torch.Tensor:
    """A pixel-space mask video `[F, H, W]` in [0, 1] → one weight per reference token `[f·h·w]` float32 (ltx-pipelines
    `downsample_mask_video_to_latent`): its first `clip_frames` frames fitted to the stage's pixel size `stage_hw`
    (cover and centre-crop, like the frames), each reference cell the mean of the pixels it covers (area), then
    latent frame 0 from pixel frame 0 and each later one the mean of the next `(F − 1) / (f − 1)` frames. A reference
    of one latent frame takes pixel frame 0; a one-frame mask holds for every latent frame (the reference refuses
    it)."""
    from ..encode.image_prep import resize_crop
    f, h, w = latent_fhw
    used = mask[:clip_frames].float()
    count = used.shape[0]
    if 1 < count < clip_frames:  # fits the grouping by chance only: it would be stretched over the whole clip
        raise LTX25Error(where, "the attention mask's frame count", count, f"1 or the clip's {clip_frames} (more "
                         "are cut)", f"Give the mask the clip's frame count ({clip_frames}), or a single frame.")
    if count > 1 and f > 1 and (count - 1) % (f - 1):
        raise LTX25Error(where, "the attention mask's frames (up to the clip's length)", count,
                         f"1 or 1 + {f - 1}·k: the reference's {f} latent frames are frame 0, then {f - 1} equal "
                         "groups", f"Give the mask the clip's frame count ({clip_frames}), or a single frame.")
    stage_h, stage_w = stage_hw
    fitted = resize_crop(used[..., None].expand(*used.shape, 3), stage_w, stage_h, where)[..., 0]  # [F, H1, W1]
    cells = torch.nn.functional.interpolate(fitted[:, None], size=(h, w), mode="area")[:, 0]    # [F, h, w]
    if count == 1 or f == 1:
        frames = cells[:1].expand(f, h, w)
    else:
        rest = cells[1:].unflatten(0, (f - 1, (count - 1) // (f - 1))).mean(dim=1)
        frames = torch.cat([cells[:1], rest])
    return frames.flatten().clamp(0.0, 1.0)


class _BiasedSelfAttention:
    """A video self-attention processor for one forward: the module's own processor, given the bias as its mask
    (broadcast to `[B·heads, T, T]` without a copy; diffusers views it as `[B, heads, T, T]`)."""

    def __init__(self, inner, bias: torch.Tensor) -> None:
        self.inner, self.bias = inner, bias

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        # The DiT is called without a video self-attention mask, so there is none here to combine with.
        mask = self.bias.expand(hidden_states.shape[0] * attn.heads, *self.bias.shape)
        return self.inner(attn, hidden_states, encoder_hidden_states, mask, query_rotary_emb, key_rotary_emb)


@contextmanager
def biased_video_self_attention(blocks: torch.nn.ModuleList, bias: torch.Tensor | None) -> Iterator[None]:
    """Within the block, the video self-attention (`attn1`) of every DiT block adds `bias` `[T, T]` (None: nothing
    changes). Only Python attributes change, so a CUDA graph may be captured inside; the processors in place before
    (perturbation.py's too, which pass the mask on) are back on exit, also after an error."""
    if bias is None:
        yield
        return
    installed = []
    try:
        for block in blocks:
            installed.append((block.attn1, block.attn1.processor))
            block.attn1.set_processor(_BiasedSelfAttention(block.attn1.processor, bias))
        yield
    finally:
        for attn, processor in reversed(installed):
            attn.set_processor(processor)
