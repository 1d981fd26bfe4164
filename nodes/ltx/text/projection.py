"""Feature extractor V2 + text projection (LTX-2.3/2.5, docs/MODEL.md §3.4): all Gemma hidden states → per-token RMS
norm per layer → flatten hidden-major/layer-minor → zero padded tokens → one Linear per stream, each fed the
normed features times `sqrt(out_dim / hidden)`.

Real shapes: 49 hidden states of [B, 1024, 3840] → [B, 1024, 188160] → video [B, 1024, 4096] (×sqrt(4096/3840)),
audio [B, 1024, 2048] (×sqrt(2048/3840)). Tiny file: 7 × [B, 1024, 64] → [B, 1024, 448] → video 64 (×1), audio 32
(×sqrt(1/2)): the rescale always uses the Linear's own `out_features` and the Gemma hidden size.
"""
from __future__ import annotations

import math

import torch
from torch import nn

RMS_EPS = 1e-6


def rms_normalize(hidden: torch.Tensor) -> torch.Tensor:
    """`x * rsqrt(mean_D(x²) + 1e-6)` per token, in the hidden-state dtype like the reference: [B, T, D] → same."""
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def normalize_and_flatten(hidden_states: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """L hidden states [B, T, D] + mask [B, T] (1 = valid) → [B, T, D·L] with element (d, l) at index d·L + l
    (hidden-major, layer-minor: the order the projection weights were trained with); padded tokens are zero.

    Consumes `hidden_states`: the list is emptied as each layer is copied in, so each [B, T, D] state is freed as
    soon as it is no longer needed and peak memory stays near one copy of the stack."""
    first = hidden_states[0]
    b, t, d = first.shape
    n_layers = len(hidden_states)
    flat = torch.empty(b, t, d, n_layers, dtype=first.dtype, device=first.device)  # [B, T, D, L]
    for layer in range(n_layers):
        hidden = hidden_states[layer]
        hidden_states[layer] = None  # type: ignore[call-overload]  # drop our reference right away
        flat[..., layer] = rms_normalize(hidden)
        del hidden
    hidden_states.clear()
    flat = flat.view(b, t, d * n_layers)
    # where, not multiply: a NaN/inf on a padded row must not leak (0·NaN = NaN).
    return flat.masked_fill_(~mask.to(device=flat.device, dtype=torch.bool).unsqueeze(-1), 0.0)


def stream_scale(out_features: int, hidden_size: int) -> float:
    """The per-stream rescale before each projection: sqrt(out_dim / gemma_hidden) (real: 4096/3840, 2048/3840)."""
    return math.sqrt(out_features / hidden_size)


class TextProjection(nn.Module):
    """`text_embedding_projection.{video,audio}_aggregate_embed` (weights + biases) of the text-encoder file.

    Args:
        hidden_size: Gemma hidden width (3840; tiny 64).
        num_states: hidden states fed in, embedding output included (49; tiny 7).
        video_dim / audio_dim: output widths (4096 / 2048; tiny TINY_DIMS video_inner / audio_inner).
    """

    def __init__(self, hidden_size: int, num_states: int, video_dim: int, audio_dim: int) -> None:
        super().__init__()
        self.hidden_size, self.num_states = hidden_size, num_states
        self.video_aggregate_embed = nn.Linear(hidden_size * num_states, video_dim, bias=True)
        self.audio_aggregate_embed = nn.Linear(hidden_size * num_states, audio_dim, bias=True)

    def project(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, D·L] normed features → (video [B, T, video_dim], audio [B, T, audio_dim])."""
        outputs = []
        for linear in (self.video_aggregate_embed, self.audio_aggregate_embed):
            outputs.append(linear(flat * stream_scale(linear.out_features, self.hidden_size)))
        return outputs[0], outputs[1]

    def forward(self, hidden_states: list[torch.Tensor], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`num_states` hidden states [B, T, D] (consumed, see `normalize_and_flatten`) + mask [B, T] →
        (video [B, T, video_dim], audio [B, T, audio_dim])."""
        if len(hidden_states) != self.num_states:
            raise ValueError(f"{len(hidden_states)} hidden states given, the projection takes {self.num_states}")
        return self.project(normalize_and_flatten(hidden_states, mask))
