"""The DiT's attention processor: diffusers' LTX-2 processor, with the query/key norm and split RoPE fused into one
pass (kernels/qk_norm_rope.py) where that kernel can run and the blocks are not being compiled.

Everything else is diffusers' own computation in diffusers' order: the projections, the attention through
`dispatch_attention_fn`, the per-head gates and the output projection. Calls the fused pass does not cover (no
rotary positions, an attention mask, interleaved RoPE, no Triton, inside `torch.compile`) go to diffusers'
processor unchanged. tests/test_qk_norm_rope.py checks the two paths against each other on the tiny DiT.
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_ltx2 import LTX2Attention, LTX2AudioVideoAttnProcessor

from ..kernels import qk_norm_rope


class FusedQKAttnProcessor(LTX2AudioVideoAttnProcessor):
    """diffusers' processor; a call with split rotary positions and no mask, on a GPU where the kernel runs and
    outside `torch.compile`, norms and rotates q and k in one pass."""

    def __call__(self, attn: LTX2Attention, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                 key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if query_rotary_emb is None or attention_mask is not None or attn.rope_type != "split" \
                or torch.compiler.is_compiling() or not qk_norm_rope.available(hidden_states):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                    key_rotary_emb)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        query = qk_norm_rope.norm_split_rope(attn.to_q(hidden_states), attn.norm_q, query_rotary_emb)
        key = qk_norm_rope.norm_split_rope(attn.to_k(context), attn.norm_k,
                                           key_rotary_emb if key_rotary_emb is not None else query_rotary_emb)
        value = attn.to_v(context)
        out = dispatch_attention_fn(query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1)),
                                    value.unflatten(2, (attn.heads, -1)), attn_mask=None, dropout_p=0.0,
                                    is_causal=False, backend=self._attention_backend,
                                    parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(query.dtype)
        if gate_logits is not None:  # 2·sigmoid: zero-initialized logits gate by 1
            out = (out.unflatten(2, (attn.heads, -1)) * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)).flatten(2, 3)
        return attn.to_out[1](attn.to_out[0](out))


def install(model: torch.nn.Module) -> None:
    """Every LTX-2 attention of `model` gets the fused processor. The perturbation wrappers call it as their inner
    processor; the IC-LoRA wrapper passes its bias as a mask, which keeps diffusers' path for that attention."""
    for module in model.modules():
        if isinstance(module, LTX2Attention):
            module.set_processor(FusedQKAttnProcessor())
