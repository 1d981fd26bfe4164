"""The diffusion decoder's block forwards the `triton` processor installs: stage 5's with its elementwise passes
fused, and for every block (stages 1-5) residuals added in place and projections made a chunk of rows at a time.

diffusers' `LTX2VideoVaeDiffusionNABlock.forward` is, per block, an RMS norm then a multiply and an add for each of
its two modulations, three out-of-place residual adds, and a SwiGLU in tiles of 16384 tokens (silu and the gate
product as two more passes). At 768×512×121 (2.97 M tokens × 256 channels, eight blocks) each of those is a full
pass over a 1.5 GB tensor, and together they were a large share of the decode (profile:
docs/bench_logs/dvae_profile_triton.txt).

Here each norm·modulation is one Triton pass (float32 math, one rounding), the residuals are added in place (the
SwiGLU's down projection accumulates straight into the hidden state with `addmm_`), and the gate and up projections
are one Triton GEMM whose epilogue applies silu(gate)·up (`swiglu_hidden`): the two hidden-width projections never
reach memory, only their product (before: two cuBLAS GEMMs and a silu·gate pass reading both). Same math as the
reference; bf16 results differ by rounding only (the reference rounds
after the norm, after each modulation step and after each projection). Tested in float32 through Triton's
interpreter against diffusers' own forward.

Memory: diffusers' blocks make a new hidden state per residual while the caller still holds the old one, and keep
the attention's input, q, k, v, their rotated copies and the attention's output alive together (12 tensors of the
width per token at stage 5 with the context). Here the residuals go into the caller's tensor, q|k|v is the only
full-size temporary (filled from normed rows a chunk at a time; the attention is written over q) and the other
projections are added a chunk at a time: 5 per token at stage 5 (with the context), 4 at stages 1-4
(docs/PERFORMANCE.md, "The diffusion decoder's memory").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import compat
from . import na_attention
from .na_triton import on_device, tl, triton

SWIGLU_TOKENS = 65536  # tokens per SwiGLU tile: one hidden-width bf16 temporary, 128 MiB at C = 256 (hidden 1024)
CHUNK_ELEMENTS = 1 << 25  # values per chunk of the lean blocks' temporaries (64 MiB in bf16; `chunk_rows`)


@dataclass(frozen=True)
class GemmConfig:
    """`swiglu_hidden`'s launch: output block (tokens × hidden channels), K step, warps, pipeline stages. The
    default was the fastest of the shapes tried on a 65536-token tile (bench/bench_swiglu.py; figures in
    docs/PERFORMANCE.md)."""
    block_m: int = 128
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


SWIGLU_GEMM = GemmConfig()


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
    def swiglu_hidden(x_ptr, gate_ptr, up_ptr, o_ptr, M, N, K, s_x, s_w, s_o,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRECISION: tl.constexpr):
        tiles_n = tl.cdiv(N, BLOCK_N)
        # neighbouring programs share the token rows (read once from memory); the weights stay in L2
        m = (tl.program_id(0) // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + m.to(tl.int64)[:, None] * s_x + k[None, :],
                        mask=(m < M)[:, None] & (k < K)[None, :], other=0.0)
            w_mask = (k < K)[:, None] & (n < N)[None, :]
            w_at = n[None, :] * s_w + k[:, None]                           # [K, N] views of the [N, K] weights
            gate = tl.dot(x, tl.load(gate_ptr + w_at, mask=w_mask, other=0.0), gate, input_precision=PRECISION)
            up = tl.dot(x, tl.load(up_ptr + w_at, mask=w_mask, other=0.0), up, input_precision=PRECISION)
        hidden = gate * tl.sigmoid(gate) * up
        tl.store(o_ptr + m.to(tl.int64)[:, None] * s_o + n[None, :], hidden.to(o_ptr.dtype.element_ty),
                 mask=(m < M)[:, None] & (n < N)[None, :])

    return norm_modulate, swiglu_hidden


_norm_modulate_kernel, _swiglu_kernel = _define_kernels() if triton is not None else (None, None)


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


def swiglu_hidden(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, config: GemmConfig = SWIGLU_GEMM
                  ) -> torch.Tensor:
    """`silu(x @ gate.T) * (x @ up.T)` for `x` `[M, K]` (rows contiguous) and bias-free weights `[N, K]`, in one
    GEMM with float32 accumulators and one rounding."""
    x, gate, up = x.contiguous(), gate.contiguous(), up.contiguous()
    (tokens, channels), hidden = x.shape, gate.shape[0]
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(tokens, config.block_m) * triton.cdiv(hidden, config.block_n),)
    with on_device(x.device):
        _swiglu_kernel[grid](x, gate, up, out, tokens, hidden, channels, x.stride(0), gate.stride(0), out.stride(0),
                             config.block_m, config.block_n, config.block_k,
                             "ieee" if x.dtype == torch.float32 else "tf32",  # float32 stays float32, not TF32
                             num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def swiglu_add_(mlp, x: torch.Tensor, out: torch.Tensor, tokens: int | None = None,
                config: GemmConfig = SWIGLU_GEMM) -> None:
    """`out += mlp(x)` for diffusers' `LTX2VideoVaeSwiGLU` (`w_down(silu(w_gate(x)) · w_up(x))`), in token tiles
    (`SWIGLU_TOKENS` unless given)."""
    tokens = SWIGLU_TOKENS if tokens is None else tokens
    down = mlp.w_down.weight.t()
    for rows_x, rows_out in zip(item_rows(x.contiguous()), item_rows(out)):
        for start in range(0, rows_x.shape[0], tokens):
            hidden = swiglu_hidden(rows_x[start:start + tokens], mlp.w_gate.weight, mlp.w_up.weight, config)
            rows_out[start:start + tokens].addmm_(hidden, down)


def chunk_rows(width: int) -> int:
    """Rows per chunk of the lean blocks' temporaries at `width` values per row: `CHUNK_ELEMENTS` values."""
    return max(1, CHUNK_ELEMENTS // width)


def item_rows(t: torch.Tensor) -> list[torch.Tensor]:
    """Per batch item of `t` `[B, ..., C]`, its tokens as rows `[n, C]`, views of `t`: an item's tokens are
    contiguous, the batch need not be (a temporal upsample that drops its leading frame leaves a strided batch)."""
    return [t[i].view(-1, t.shape[-1]) for i in range(t.shape[0])]  # indexing, not unbind: the views are written


def add_linear_(out: torch.Tensor, linear: torch.nn.Linear, x: torch.Tensor) -> None:
    """`out += linear(x)` for `[B, ..., C]` tensors, a chunk of rows at a time: the projection never exists whole."""
    step = chunk_rows(max(x.shape[-1], out.shape[-1]))
    for rows_out, rows_x in zip(item_rows(out), item_rows(x)):
        for start in range(0, rows_x.shape[0], step):
            rows_out[start:start + step] += linear(rows_x[start:start + step])


def block_forward(block, hidden_states: torch.Tensor, latent_context: torch.Tensor,
                  modulation: tuple[torch.Tensor, ...], block_mask=None) -> torch.Tensor:
    """`LTX2VideoVaeDiffusionNABlock.forward` with the fused passes (its residuals are ungated, docs/MODEL.md §10.2),
    adding every residual into `hidden_states` in place and returning it: diffusers' loop rebinds its name to the
    result, so a new tensor per block would only keep the previous one alive beside it. With a processor that
    projects q|k|v at once (`na_attention.adds_in_place`) the attention and the context projection run a chunk of
    rows at a time, so stage 5's peak holds the context, the hidden state and q|k|v and nothing else of their size
    (docs/PERFORMANCE.md, "The diffusion decoder's memory")."""
    table = block.scale_shift_table
    scale_msa, shift_msa, scale_mlp, shift_mlp = (modulation[i] + table[i].view(1, 1, 1, 1, -1) for i in (0, 1, 3, 4))
    hidden = hidden_states
    add_linear_(hidden, block.context_proj, latent_context)
    if na_attention.adds_in_place(block.attn):
        def prepare(rows: torch.Tensor, item: int) -> torch.Tensor:
            return norm_modulate(rows[None], block.norm1, scale_msa[item:item + 1], shift_msa[item:item + 1])[0]

        na_attention.add_attention_(block.attn, hidden, prepare, chunk_rows(hidden.shape[-1]))
    else:
        hidden += block.attn(norm_modulate(hidden, block.norm1, scale_msa, shift_msa), block_mask)
    swiglu_add_(block.mlp, norm_modulate(hidden, block.norm2, scale_mlp, shift_mlp), hidden)
    return hidden


def det_block_forward(block, hidden_states: torch.Tensor, block_mask=None) -> torch.Tensor:
    """`LTX2VideoVaeNABlock.forward` (stages 1-4: `x += attn(norm1(x))`, `x += mlp(norm2(x))`) with the same
    operations, run in place on `hidden_states` (returned) and a chunk of rows at a time: the attention as in
    `block_forward`, the MLP on chunks small enough that its three hidden-width temporaries stay a few chunks
    (diffusers' own tiles hold 16384 rows whatever the width: 0.8 GB at stage 1's 2048 channels)."""
    hidden = hidden_states
    if na_attention.adds_in_place(block.attn):
        na_attention.add_attention_(block.attn, hidden, lambda rows, item: block.norm1(rows),
                                    chunk_rows(hidden.shape[-1]))
    else:
        hidden += block.attn(block.norm1(hidden), block_mask)
    step = chunk_rows(block.mlp.w_up.out_features)
    for rows in item_rows(hidden):
        for start in range(0, rows.shape[0], step):
            rows[start:start + step] += block.mlp(block.norm2(rows[start:start + step]))
    return hidden


def use_fused_blocks(model: torch.nn.Module, enabled: bool) -> None:
    """Give every block of a diffusers diffusion decoder our forward (`enabled`: stage 5's `block_forward`, stages
    1-4's `det_block_forward`), or its own back."""
    for block in compat.stage5_blocks(model):
        compat.override_forward(block, block_forward if enabled else None)
    for block in compat.det_blocks(model):
        compat.override_forward(block, det_block_forward if enabled else None)
