"""The DiT's query/key RMS norm and split RoPE in one pass (Triton), for the blocks that run eagerly.

Every DiT attention with rotary positions (video self-attention, audio self-attention and both audio–video
cross-attentions) norms its query and key over all heads (`rms_norm_across_heads`), then rotates them with the split
RoPE: per head, element r of the first half and element r of the second half form a pair turned by the angle of
(token, head, r). diffusers applies the rotation (`apply_split_rotary_emb`) through strided float32 views of a copy,
about ten passes over a `[tokens, heads · head_dim]` tensor; with the norm's own read and write, eager blocks spent
about a third of a stage-2 step at 1280×704 in such element-wise kernels (docs/PERFORMANCE.md). This kernel reads
each token's row once, norms it and rotates it in float32 registers and writes it once. The compiled blocks do not
need it (Inductor fuses the same operations), so it runs only outside `torch.compile`.

Rounding: the norm is rounded to the tensor's dtype before the rotation, as diffusers' two steps do, so the two
paths differ only by the order of float32 sums and products. Exactness against diffusers is tested with Triton's
interpreter on the CPU (tests/test_qk_norm_rope.py).
"""
from __future__ import annotations

import logging

import torch
from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

from ..errors import LTX25Error
from .na_triton import on_device

try:  # optional, as for the pack's other kernels: without Triton the callers keep diffusers' path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU builds of torch come without Triton
    triton = None

log = logging.getLogger("ltx25")
WHERE = "DiT attention (fused q/k norm and RoPE)"


def _define_kernel():
    @triton.jit
    def norm_split_rope(x_ptr, o_ptr, weight_ptr, cos_ptr, sin_ptr, tokens, heads, eps, x_b, x_t, o_b, o_t,
                        c_b, c_h, c_t, s_b, s_h, s_t, HEADS_PAD: tl.constexpr, R: tl.constexpr,
                        R_PAD: tl.constexpr, HAS_WEIGHT: tl.constexpr):
        row = tl.program_id(0)                               # one token of one batch item
        b, t = row // tokens, row % tokens
        h = tl.arange(0, HEADS_PAD)[:, None]
        r = tl.arange(0, R_PAD)[None, :]
        mask = (h < heads) & (r < R)
        first = h * (2 * R) + r                              # element r of each head's first half
        x_row = x_ptr + b.to(tl.int64) * x_b + t.to(tl.int64) * x_t
        x1 = tl.load(x_row + first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + first + R, mask=mask, other=0.0).to(tl.float32)
        inv_rms = tl.rsqrt((tl.sum(tl.sum(x1 * x1, 1), 0) + tl.sum(tl.sum(x2 * x2, 1), 0)) / (heads * 2 * R) + eps)
        n1, n2 = x1 * inv_rms, x2 * inv_rms
        if HAS_WEIGHT:
            n1 = n1 * tl.load(weight_ptr + first, mask=mask, other=0.0).to(tl.float32)
            n2 = n2 * tl.load(weight_ptr + first + R, mask=mask, other=0.0).to(tl.float32)
        # the norm's output in the tensor's dtype, as the unfused path hands it to the rotation
        n1 = n1.to(o_ptr.dtype.element_ty).to(tl.float32)
        n2 = n2.to(o_ptr.dtype.element_ty).to(tl.float32)
        cos = tl.load(cos_ptr + b.to(tl.int64) * c_b + t.to(tl.int64) * c_t + h * c_h + r, mask=mask, other=0.0)
        sin = tl.load(sin_ptr + b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + h * s_h + r, mask=mask, other=0.0)
        o_row = o_ptr + b.to(tl.int64) * o_b + t.to(tl.int64) * o_t
        tl.store(o_row + first, (n1 * cos - sin * n2).to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + first + R, (n2 * cos + sin * n1).to(o_ptr.dtype.element_ty), mask=mask)

    return norm_split_rope


_kernel = _define_kernel() if triton is not None else None
_WORKS: dict[torch.device, bool] = {}  # per device: whether the probe passed


def available(x: torch.Tensor) -> bool:
    """Whether the processor takes the fused pass for `x`: Triton is there, `x` is on a CUDA device, and there
    (checked once per device) a probe computes what diffusers' two steps do. A GPU where Triton cannot build or run
    the kernel (no C compiler, pre-Ampere, ROCm) keeps diffusers' path instead of failing the DiT. (Triton's
    interpreter runs the kernel on the CPU too, for the tests, but far slower than diffusers' path.)"""
    if _kernel is None or not x.is_cuda:
        return False
    works = _WORKS.get(x.device)  # asked by every rotary attention call: a lookup, no string
    if works is None:
        if torch.cuda.is_current_stream_capturing():
            return False  # no probe inside a capture (the warm-up forward before every capture has run it)
        works = _WORKS[x.device] = _probe(x.device)
    return works


def _probe(device: torch.device) -> bool:
    if device.type == "cuda" and (torch.version.hip is not None or torch.cuda.get_device_capability(device) < (8, 0)):
        return False  # bf16 in Triton needs Ampere or newer; never built or measured on ROCm
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4 * 16, generator=g).to(device, torch.bfloat16)
    norm = torch.nn.RMSNorm(4 * 16, eps=1e-6).to(device, torch.bfloat16)
    angles = torch.randn(2, 4, 3, 8, generator=g).to(device)
    freqs = (angles.cos(), angles.sin())
    try:
        with torch.no_grad():
            want = apply_split_rotary_emb(norm(x), freqs).float()
            err = (norm_split_rope(x, norm, freqs).float() - want).abs().max().item()
    except Exception as error:  # noqa: BLE001 - any build or launch failure: diffusers' path still works
        log.warning("LTX-2.5: the fused q/k norm and RoPE kernel does not run on %s (%s: %s); the DiT uses "
                    "diffusers' norm and RoPE there (slower)", device, type(error).__name__, str(error)[:200])
        return False
    if err > 2 * 2.0**-7 * want.abs().max().item():  # two bf16 roundings of the values' scale
        log.warning("LTX-2.5: the fused q/k norm and RoPE kernel computed a wrong result on %s (max error %.3g); "
                    "the DiT uses diffusers' norm and RoPE there", device, err)
        return False
    return True


def norm_split_rope(x: torch.Tensor, norm: torch.nn.RMSNorm, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """`apply_split_rotary_emb(norm(x), freqs)` of diffusers' LTX-2 attention in one pass: `x` `[B, T, heads·D]` (a
    projection's output, its last axis contiguous), `freqs` = (cos, sin), each `[B or 1, heads, T, D/2]` float32 with
    its last axis contiguous. A new tensor of x's shape and dtype."""
    cos, sin = freqs
    batch, tokens, width = x.shape
    if cos.ndim != 4 or sin.shape != cos.shape or cos.shape[0] not in (1, batch) or cos.shape[2] != tokens \
            or cos.shape[1] * 2 * cos.shape[3] != width:
        raise LTX25Error(WHERE, "the rotary tables (cos, sin)", f"{list(cos.shape)} and {list(sin.shape)}",
                         f"[{batch} or 1, heads, {tokens}, head_dim / 2] each, heads × head_dim = {width}")
    if norm.weight is not None and norm.weight.numel() != width:
        raise LTX25Error(WHERE, "the norm's weight", list(norm.weight.shape), f"[{width}]")
    heads, half = cos.shape[1], cos.shape[3]
    if x.stride(2) != 1:
        x = x.contiguous()
    cos, sin = (f if f.stride(3) == 1 else f.contiguous() for f in (cos, sin))
    cos, sin = cos.expand(batch, -1, -1, -1), sin.expand(batch, -1, -1, -1)  # batch 1 tables: stride 0
    out = torch.empty((batch, tokens, width), dtype=x.dtype, device=x.device)
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    weight = norm.weight.contiguous() if norm.weight is not None else x  # not read without a weight
    with on_device(x.device):
        _kernel[(batch * tokens,)](x, out, weight, cos, sin, tokens, heads, float(eps), x.stride(0), x.stride(1),
                                   out.stride(0), out.stride(1), cos.stride(0), cos.stride(1), cos.stride(2),
                                   sin.stride(0), sin.stride(1), sin.stride(2), triton.next_power_of_2(heads), half,
                                   triton.next_power_of_2(half), norm.weight is not None)
    return out
