"""Stage 5's diffusion block with its elementwise passes fused: the block forward the `triton` processor installs.

diffusers' `LTX2VideoVaeDiffusionNABlock.forward` is, per block, an RMS norm then a multiply and an add for each of
its two modulations, three out-of-place residual adds, and a SwiGLU in tiles of 16384 tokens (silu and the gate
product as two more passes). At 768×512×121 (2.97 M tokens × 256 channels, eight blocks) the profile
(docs/bench_logs/dvae_profile_triton.txt) put the norms at 178 ms of a 1.2 s decode and the modulations' multiplies
and adds at 130 ms more: each a full pass over a 1.5 GB tensor.

Here each norm·modulation is one Triton pass (float32 math, one rounding), the residuals are added in place (the
SwiGLU's down projection accumulates straight into the hidden state with `addmm_`), and silu·gate is one pass in
place. Same math as the reference; bf16 results differ by rounding only (the reference rounds after the norm and
after each modulation step). Tested in float32 through Triton's interpreter against diffusers' own forward.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from .na_triton import on_device, tl, triton

SWIGLU_TOKENS = 32768  # tokens per SwiGLU tile: two hidden-width bf16 temporaries of 64 MiB at C = 256


def _define_kernels():
    @triton.jit
    def norm_modulate(x_ptr, o_ptr, weight_ptr, scale_ptr, shift_ptr, rows, tokens, C, eps,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # row = batch · tokens + token
        c = tl.arange(0, BLOCK_C)
        mask = (r < rows)[:, None] & (c < C)[None, :]
        at = r.to(tl.int64)[:, None] * C + c[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / C + eps)
        weight = tl.load(weight_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        per_batch = (r // tokens)[:, None] * C + c[None, :]
        scale = tl.load(scale_ptr + per_batch, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + per_batch, mask=mask, other=0.0).to(tl.float32)
        y = x * inv_rms[:, None] * weight[None, :] * (1.0 + scale) + shift
        tl.store(o_ptr + at, y.to(o_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def silu_mul_(gate_ptr, up_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        gate = tl.load(gate_ptr + i, mask=i < n, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + i, mask=i < n, other=0.0).to(tl.float32)
        tl.store(gate_ptr + i, (gate * tl.sigmoid(gate) * up).to(gate_ptr.dtype.element_ty), mask=i < n)

    return norm_modulate, silu_mul_


_norm_modulate_kernel, _silu_mul_kernel = _define_kernels() if triton is not None else (None, None)


def norm_modulate(x: torch.Tensor, norm: torch.nn.RMSNorm, scale: torch.Tensor, shift: torch.Tensor,
                  block_rows: int = 16) -> torch.Tensor:
    """`norm(x) * (1 + scale) + shift` in one pass: `x` `[B, ..., C]` contiguous, `scale`/`shift` `[B, 1, .., C]`."""
    x = x.contiguous()
    batch, channels = x.shape[0], x.shape[-1]
    rows = x.numel() // channels
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    weight = norm.weight if norm.weight is not None else torch.ones(channels, device=x.device, dtype=x.dtype)
    out = torch.empty_like(x)
    with on_device(x.device):
        _norm_modulate_kernel[(-(-rows // block_rows),)](
            x, out, weight, scale.reshape(batch, channels).contiguous(), shift.reshape(batch, channels).contiguous(),
            rows, rows // batch, channels, float(eps), block_rows, triton.next_power_of_2(channels))
    return out


def swiglu_add_(mlp, x: torch.Tensor, out: torch.Tensor, tokens: int = SWIGLU_TOKENS) -> None:
    """`out += mlp(x)` for diffusers' `LTX2VideoVaeSwiGLU` (`w_down(silu(w_gate(x)) · w_up(x))`), in token tiles."""
    flat_x, flat_out = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
    down = mlp.w_down.weight.t()
    for start in range(0, flat_x.shape[0], tokens):
        part = flat_x[start:start + tokens]
        gate, up = F.linear(part, mlp.w_gate.weight), F.linear(part, mlp.w_up.weight)
        with on_device(x.device):
            _silu_mul_kernel[(-(-gate.numel() // 1024),)](gate, up, gate.numel(), 1024)
        flat_out[start:start + tokens].addmm_(gate, down)


def block_forward(block, hidden_states: torch.Tensor, latent_context: torch.Tensor,
                  modulation: tuple[torch.Tensor, ...], block_mask=None) -> torch.Tensor:
    """`LTX2VideoVaeDiffusionNABlock.forward` with the fused passes (its residuals are ungated, ltx25.md §10)."""
    table = block.scale_shift_table
    scale_msa, shift_msa, scale_mlp, shift_mlp = (modulation[i] + table[i].view(1, 1, 1, 1, -1) for i in (0, 1, 3, 4))
    hidden = hidden_states + block.context_proj(latent_context)  # a new tensor: the caller's input stays intact
    hidden += block.attn(norm_modulate(hidden, block.norm1, scale_msa, shift_msa), block_mask)
    swiglu_add_(block.mlp, norm_modulate(hidden, block.norm2, scale_mlp, shift_mlp), hidden)
    return hidden


def use_fused_blocks(model: torch.nn.Module, enabled: bool) -> None:
    """Give every stage-5 block of a diffusers diffusion decoder the fused forward (`enabled`), or its own back."""
    for module in model.modules():
        if type(module).__name__ == "LTX2VideoVaeDiffusionNABlock":
            if enabled:
                module.forward = types.MethodType(block_forward, module)
            else:
                module.__dict__.pop("forward", None)
