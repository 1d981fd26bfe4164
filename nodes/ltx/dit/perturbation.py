"""Attention perturbations of the guidance passes (docs/MODEL.md §15.2), per sample of a batch, as attention
processors installed on the DiT's attention modules for the duration of one forward (never left on the model).

The reference's four perturbation types, and what a perturbed sample gets in the named blocks:
- video / audio self-attention (STG): the attention output is replaced by the value projection (`to_v(x)`), which
  then goes through the per-head gate and `to_out` as usual — diffusers' `LTX2PerturbedAttnProcessor` with
  `all_perturbed`, reused as is;
- audio→video / video→audio cross-attention (modality guidance): the block adds nothing for that direction.
Samples that are not perturbed go through the module's own processor untouched, so an unperturbed forward is bit
for bit the plain one. A block where every sample is perturbed skips the query/key work, as the reference does.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from diffusers.models.transformers.transformer_ltx2 import LTX2PerturbedAttnProcessor

VIDEO_SELF, AUDIO_SELF, A2V, V2A = "video_self_attn", "audio_self_attn", "a2v_cross_attn", "v2a_cross_attn"
KINDS = (VIDEO_SELF, AUDIO_SELF, A2V, V2A)
# the attention module of a DiT block each kind perturbs
MODULE_OF = {VIDEO_SELF: "attn1", AUDIO_SELF: "audio_attn1", A2V: "audio_to_video_attn", V2A: "video_to_audio_attn"}


@dataclass(frozen=True)
class Perturbation:
    """What one sample's forward skips: (kind, blocks) pairs, blocks None meaning every block."""
    skips: tuple[tuple[str, frozenset[int] | None], ...] = ()

    def skipped(self, kind: str, block: int) -> bool:
        return any(k == kind and (blocks is None or block in blocks) for k, blocks in self.skips)


NONE = Perturbation()


def keep_masks(samples: Sequence[Perturbation], num_blocks: int) -> dict[tuple[str, int], tuple[bool, ...]]:
    """{(kind, block): per-sample keep flags} for every (kind, block) some sample perturbs (pure bookkeeping)."""
    masks = {}
    for kind in KINDS:
        for block in range(num_blocks):
            keep = tuple(not s.skipped(kind, block) for s in samples)
            if not all(keep):
                masks[(kind, block)] = keep
    return masks


_VALUE_PASSTHROUGH = LTX2PerturbedAttnProcessor()


class _SkipSelfAttention:
    """A self-attention whose perturbed samples get the value projection in place of the attention output."""

    def __init__(self, inner, keep: torch.Tensor | None) -> None:
        self.inner, self.keep = inner, keep  # keep: bool [B, 1, 1], or None when every sample is perturbed

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        passthrough = _VALUE_PASSTHROUGH(attn, hidden_states, encoder_hidden_states, attention_mask,
                                         all_perturbed=True)
        if self.keep is None:
            return passthrough
        full = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                          key_rotary_emb)
        return torch.where(self.keep, full, passthrough)


class _SkipCrossModal:
    """An audio↔video cross-attention whose perturbed samples contribute nothing (the block adds gate · 0)."""

    def __init__(self, inner, keep: torch.Tensor | None) -> None:
        self.inner, self.keep = inner, keep

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        if self.keep is None:
            return hidden_states.new_zeros(*hidden_states.shape[:2], attn.to_out[0].out_features)
        out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                         key_rotary_emb)
        return torch.where(self.keep, out, torch.zeros((), dtype=out.dtype, device=out.device))


Masks = dict[tuple[str, int], "torch.Tensor | None"]  # (kind, block) → keep mask [B, 1, 1], None: all perturbed


def build_masks(samples: Sequence[Perturbation], num_blocks: int, device: torch.device) -> Masks:
    """The keep masks of a batch whose rows are perturbed as `samples` say, on `device` (made before any CUDA-graph
    capture: a capture cannot copy from the host)."""
    return {key: None if not any(keep) else torch.tensor(keep, device=device).view(-1, 1, 1)
            for key, keep in keep_masks(samples, num_blocks).items()}


@contextmanager
def perturbed(blocks: torch.nn.ModuleList, masks: Masks) -> Iterator[None]:
    """Within the block, forwards of the DiT's `transformer_blocks` perturb the batch rows as `masks` say (only
    Python attributes change, so a CUDA graph may be captured inside); the modules' own processors are back on exit,
    also after an error."""
    installed = []
    try:
        for (kind, block), mask in masks.items():
            attn = getattr(blocks[block], MODULE_OF[kind])
            skip = _SkipSelfAttention if kind in (VIDEO_SELF, AUDIO_SELF) else _SkipCrossModal
            installed.append((attn, attn.processor))
            attn.set_processor(skip(attn.processor, mask))
        yield
    finally:
        for attn, processor in reversed(installed):
            attn.set_processor(processor)
