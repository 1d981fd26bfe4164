"""3-D neighborhood-attention processors for diffusers' `LTX2VideoVaeNeighborhoodAttention` (the diffusion VAE).

Each processor is a diffusers attention processor installed with `set_attn_processor`: it takes Q/K/V from the
module's own `project_qkv` (RMS-normed, query pre-scaled by 1/sqrt(head_dim), 3-D RoPE) and runs the window
attention with `scale=1.0`. Window per axis: exactly `k` keys starting at `clamp(i − k//2, 0, L − k)` — shifted
inward at borders, never truncated (NATTEN `na3d` semantics; ltx25.md §10.2).

- `sdpa`: exact neighborhood attention on PyTorch SDPA over blocks of queries and their key halo; the reference
  the others are tested against; CPU and GPU; memory bounded by the query block and the gather chunk.
- `natten`: a local `natten.na3d` (never fetched from the Hub).
- `comfy_kitchen`: `comfy_kitchen.na3d` (fused CUDA/Triton kernels on the GPU, its eager path on the CPU).
- `auto`: the fastest available on the device, per window size (`ByWindowProcessor`).
An unavailable backend is an `LTX25Error`, never a silent fallback.
"""
from __future__ import annotations

import functools
import itertools
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import LTX25Error

PROCESSORS = ("auto", "sdpa", "natten", "comfy_kitchen")
WHERE = "processor"
CUDA_CHUNK, CPU_CHUNK = 2**27, 2**23  # sdpa: gathered key elements per batched call (CPU: also the scores)
SMALL_WINDOW = 3 * 7 * 7  # the deterministic stages' largest window; stage 5's is 11³


def window_start(i: int, length: int, kernel: int) -> int:
    """First key of query `i`'s window: centered, shifted inward at the borders so it always holds `kernel` keys."""
    return min(max(i - kernel // 2, 0), length - kernel)


@dataclass(frozen=True)
class _Run:
    """Query blocks along one axis whose query and key-region starts both advance by constant steps."""
    q0: int
    q_step: int
    r0: int
    r_step: int
    count: int

    def part(self, first: int, count: int) -> "_Run":
        return _Run(self.q0 + first * self.q_step, self.q_step, self.r0 + first * self.r_step, self.r_step, count)


def _axis_classes(length: int, kernel: int, block: int) -> tuple[int, dict]:
    """Key-region length and {(q_len, window starts relative to the region): [runs]} along one axis."""
    region = min(length, block + kernel - 1)
    classes: dict = {}
    for q0 in range(0, length, block):
        q_len = min(block, length - q0)
        r0 = min(max(q0 - kernel // 2, 0), length - region)
        rel = tuple(window_start(i, length, kernel) - r0 for i in range(q0, q0 + q_len))
        runs = classes.setdefault((q_len, rel), [])
        last = runs[-1] if runs else None
        if last and last.count == 1 and q0 - last.q0 == block:  # second block fixes the run's steps
            runs[-1] = _Run(last.q0, block, last.r0, r0 - last.r0, 2)
        elif last and q0 == last.q0 + last.count * last.q_step and r0 == last.r0 + last.count * last.r_step:
            runs[-1] = _Run(last.q0, last.q_step, last.r0, last.r_step, last.count + 1)
        else:
            runs.append(_Run(q0, block, r0, 0, 1))
    return region, classes


@functools.lru_cache(maxsize=64)
def _plan(dims: tuple[int, ...], kernel: tuple[int, ...], block: tuple[int, ...], device: str):
    """Key-region shape and, per geometry group, (query block shape, runs per axis, per-axis window masks
    `[q_len, region]` or None when every window covers the whole region). Cached: all blocks of a decoder stage
    (and all tiles of one size) attend over the same grid. Only these 1-D masks are kept; the `[Nq, Nk]` bias is
    rebuilt per call, so the cache holds kilobytes, not a mask per tile shape."""
    axes = [_axis_classes(n, k, min(b, n)) for n, k, b in zip(dims, kernel, block)]
    region = tuple(r for r, _ in axes)
    groups = []
    for (ct, rt), (ch, rh), (cw, rw) in itertools.product(*(a[1].items() for a in axes)):
        masks = []
        for (q_len, rel), r, k in zip((ct, ch, cw), region, kernel):
            keys = torch.arange(r)[None, :]
            starts = torch.tensor(rel)[:, None]
            masks.append((keys >= starts) & (keys < starts + k))  # [q_len, region]
        full = all(bool(m.all()) for m in masks)  # no mask needed, and SDPA may pick a flash kernel
        groups.append(((ct[0], ch[0], cw[0]), (rt, rh, rw), None if full else [m.to(device) for m in masks]))
    return region, groups


def _bias(masks: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Additive `[Nq, Nk]` bias (0 / −inf) of the separable window mask, rows padded to 16 elements: SDPA's
    memory-efficient kernel wants aligned strides and would otherwise pad a copy on every call."""
    visible = masks[0][:, None, None, :, None, None] & masks[1][None, :, None, None, :, None] \
        & masks[2][None, None, :, None, None, :]
    n_q = masks[0].shape[0] * masks[1].shape[0] * masks[2].shape[0]
    n_k = masks[0].shape[1] * masks[1].shape[1] * masks[2].shape[1]
    bias = torch.zeros(n_q, -(-n_k // 16) * 16, dtype=dtype, device=visible.device)[:, :n_k]
    return bias.masked_fill_(~visible.reshape(n_q, n_k), float("-inf"))


def _token_index(runs: tuple[_Run, _Run, _Run], shape: tuple[int, int, int], dims: tuple[int, int, int],
                 batch: int, keys: bool, device: torch.device) -> torch.Tensor:
    """Flat token indices `[B·Gt·Gh·Gw·t·h·w]` of the query blocks (or their key regions) of `runs` in a
    `[B, T, H, W]` grid. Gathering rows by index copies whole `heads·D` rows with one vectorized kernel; the strided
    9-D view it replaces was copied element by element and cost more than the attention itself (profile of
    2026-11-29, docs/PERFORMANCE.md)."""
    axes = []
    for run, n in zip(runs, shape):
        start, step = (run.r0, run.r_step) if keys else (run.q0, run.q_step)
        axes.append(start + step * torch.arange(run.count, device=device)[:, None] + torch.arange(n, device=device))
    (t, h, w), (_, height, width) = axes, dims
    grid = (t[:, None, None, :, None, None] * height + h[None, :, None, None, :, None]) * width \
        + w[None, None, :, None, None, :]                                     # [Gt, Gh, Gw, t, h, w]
    first = torch.arange(batch, device=device).view(-1, 1, 1, 1, 1, 1, 1) * math.prod(dims)
    return (first + grid).reshape(-1)


def default_query_block(kernel: tuple[int, ...], cuda: bool) -> tuple[int, int, int]:
    """GPU: (4, 8, 8), ≥ 256 queries per block for the fused kernels. CPU (the math kernel materializes every
    score): about one window per block, which keeps the wasted scores `(block + k − 1)³ / (block·k³)` low."""
    return (4, 8, 8) if cuda else tuple(min(k, 8) for k in kernel)


def na3d_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: tuple[int, int, int],
              query_block: tuple[int, int, int] | None = None, chunk_elements: int | None = None) -> torch.Tensor:
    """Exact 3-D neighborhood attention with `scale=1.0` (q pre-scaled). `q, k, v`: `[B, T, H, W, heads, D]`.

    Queries are cut into `query_block` blocks (default: `default_query_block`); a block's keys are the union of
    its windows (`block + k − 1` per axis). Blocks whose windows sit alike relative to that region (all interior
    blocks, a few per border) share one `[Nq, Nk]` mask and run as batched SDPA calls on rows gathered by token
    index, in chunks of at most `chunk_elements` gathered key elements (on the CPU the math kernel also
    materializes `[·, Nq, Nk]` scores).
    """
    b, t, h, w, heads, dim = q.shape
    dims = (t, h, w)
    if any(kk > n for kk, n in zip(kernel_size, dims)):
        raise LTX25Error(WHERE, "the attention grid (T, H, W)", dims, f"at least the kernel {tuple(kernel_size)}")
    if chunk_elements is None:
        chunk_elements = CUDA_CHUNK if q.is_cuda else CPU_CHUNK
    rows = [x.reshape(b * t * h * w, heads * dim) for x in (q, k, v)]           # one row per token
    query_block = query_block or default_query_block(kernel_size, q.is_cuda)
    region, groups = _plan(dims, tuple(kernel_size), tuple(query_block), str(q.device))
    n_k = math.prod(region)
    out = torch.empty(b * t * h * w, heads * dim, dtype=v.dtype, device=v.device)
    for q_shape, runs, masks in groups:
        n_q = math.prod(q_shape)
        bias = None if masks is None else _bias(masks, q.dtype)
        per_block = b * heads * (n_k * dim + (0 if q.is_cuda else n_q * n_k))
        for rt, rh, rw in itertools.product(*runs):
            steps = []  # blocks per call along W, then H, then T, so one call stays within the chunk
            for run in (rw, rh, rt):
                steps.append(max(1, min(run.count, chunk_elements // (per_block * math.prod(steps)))))
            step_w, step_h, step_t = steps
            for t0, h0, w0 in itertools.product(*(range(0, r.count, st) for r, st in
                                                  ((rt, step_t), (rh, step_h), (rw, step_w)))):
                part = tuple(r.part(i, min(st, r.count - i)) for r, i, st in
                             ((rt, t0, step_t), (rh, h0, step_h), (rw, w0, step_w)))
                g = math.prod(r.count for r in part)
                q_index = _token_index(part, q_shape, dims, b, False, q.device)
                k_index = _token_index(part, region, dims, b, True, q.device)
                qs, ks, vs = (x.index_select(0, i).view(b * g, n, heads, dim).transpose(1, 2) for x, i, n in
                              ((rows[0], q_index, n_q), (rows[1], k_index, n_k), (rows[2], k_index, n_k)))
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias, scale=1.0)   # [b·g, heads, n_q, D]
                out.index_copy_(0, q_index, o.transpose(1, 2).reshape(b * g * n_q, heads * dim))
    return out.view(b, t, h, w, heads, dim)


def _rotate(x: torch.Tensor, rope, scale: float) -> torch.Tensor:
    """diffusers' `LTX2VideoVaeRotaryPosEmbed3D(x) * scale`: each axis chunk's (even, odd) pairs rotated in float32 by
    its position's angles, then cast back. One float32 copy rotated in place by one complex multiply per axis,
    instead of ~10 full-size passes and a concat per tensor (the profile had project_qkv at 0.4 s of a 3 s decode).
    `scale` (a power of two: the query's 1/√64) is folded into the rotation, which is exact."""
    rotated = x.float()
    pairs = torch.view_as_complex(rotated.view(*x.shape[:-1], x.shape[-1] // 2, 2))
    start = 0
    for axis, dim in enumerate(rope.rope_dim_split):
        length = x.shape[1 + axis]
        positions = torch.arange(length, dtype=torch.float32, device=x.device)
        angles = positions[:, None] * rope._inv_freqs(dim, x.device)[None, :]  # the module's own frequencies
        shape = [1, 1, 1, 1, 1, dim // 2]
        shape[1 + axis] = length
        pairs[..., start:start + dim // 2].mul_(torch.polar(torch.full_like(angles, scale), angles).view(shape))
        start += dim // 2
    return rotated.to(x.dtype)


def project_qkv(attn, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`attn.project_qkv` (diffusers' `LTX2VideoVaeNeighborhoodAttention`): Q/K/V `[B, T, H, W, heads, D]`,
    RMS-normed, query × 1/√D, 3-D RoPE — with the rotation of `_rotate`. Falls back to the module's own method
    when its scale is not a power of two (folding it would round differently)."""
    if not math.log2(attn.scale).is_integer():
        return attn.project_qkv(hidden_states)
    shape = (*hidden_states.shape[:4], attn.heads, attn.head_dim)
    query = attn.norm_q(attn.to_q(hidden_states).view(shape))
    key = attn.norm_k(attn.to_k(hidden_states).view(shape))
    value = attn.to_v(hidden_states).view(shape)
    return _rotate(query, attn.rope, attn.scale), _rotate(key, attn.rope, 1.0), value


class NeighborhoodAttnProcessor:
    """Base: `project_qkv` → `na3d(q, k, v, kernel)` → `to_out`. Subclasses supply `na3d` and `name`."""
    name = ""

    def scratch_bytes(self, element_bytes: int, cuda: bool) -> int:
        """Memory one call needs beyond its inputs and output (the tile planner adds it)."""
        return 0

    def na3d(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: tuple[int, int, int]) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, attn, hidden_states: torch.Tensor, block_mask=None) -> torch.Tensor:
        batch, frames, height, width, channels = hidden_states.shape
        query, key, value = project_qkv(attn, hidden_states)  # [B, T, H, W, heads, D]
        out = self.na3d(query, key, value, tuple(attn.kernel_size))
        return attn.to_out[0](out.reshape(batch, frames, height, width, channels))


class SdpaNAProcessor(NeighborhoodAttnProcessor):
    name = "sdpa"

    def __init__(self, query_block: tuple[int, int, int] | None = None, chunk_elements: int | None = None) -> None:
        self.query_block, self.chunk_elements = query_block, chunk_elements

    def na3d(self, q, k, v, kernel):
        return na3d_sdpa(q, k, v, kernel, self.query_block, self.chunk_elements)

    def scratch_bytes(self, element_bytes: int, cuda: bool) -> int:
        chunk = self.chunk_elements or (CUDA_CHUNK if cuda else CPU_CHUNK)
        return 3 * chunk * (element_bytes if cuda else 4)  # gathered K, V and Q/out (CPU: fp32 scores)


class NattenNAProcessor(NeighborhoodAttnProcessor):
    name = "natten"

    def __init__(self) -> None:
        import natten
        self._natten = natten

    def na3d(self, q, k, v, kernel):
        with warnings.catch_warnings():
            # Without libnatten (CPU) NATTEN runs uncompiled flex attention and warns on every call about it.
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            # NATTEN's fused kernels give wrong results on non-contiguous inputs; the query is pre-scaled.
            return self._natten.na3d(q.contiguous(), k.contiguous(), v.contiguous(), kernel_size=kernel, scale=1.0)


class ComfyKitchenNAProcessor(NeighborhoodAttnProcessor):
    name = "comfy_kitchen"

    def __init__(self) -> None:
        import comfy_kitchen
        self._ck = comfy_kitchen
        self.backend = ""  # the comfy_kitchen backend its registry picked for the last call

    def na3d(self, q, k, v, kernel):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        call = {"q": q, "k": k, "v": v, "kernel_size": list(kernel), "is_causal": [False] * 3, "scale": 1.0}
        self.backend = self._ck.registry.get_capable_backend("na3d", call)
        return self._ck.na3d(q, k, v, list(kernel), scale=1.0)


class ByWindowProcessor(NeighborhoodAttnProcessor):
    """Routes each call by window volume: windows of at most `max_small` keys to `small`, larger ones to `large`.
    On an H200 comfy_kitchen's fused kernel is 4-9× faster than blocked SDPA on the deterministic stages' 3×7×7 and
    3×5×5 windows, and blocked SDPA the faster on stage 5's 11×11×11 (profile of 2026-11-29, docs/PERFORMANCE.md)."""

    def __init__(self, small: NeighborhoodAttnProcessor, large: NeighborhoodAttnProcessor,
                 max_small: int = SMALL_WINDOW) -> None:
        self.small, self.large, self.max_small = small, large, max_small
        self.name = f"{small.name}+{large.name}"

    def na3d(self, q, k, v, kernel):
        return (self.small if math.prod(kernel) <= self.max_small else self.large).na3d(q, k, v, kernel)

    def scratch_bytes(self, element_bytes: int, cuda: bool) -> int:
        return max(self.small.scratch_bytes(element_bytes, cuda), self.large.scratch_bytes(element_bytes, cuda))


# ------------------------------------------------------------------------------------------- availability
def comfy_kitchen_backends() -> tuple[str, ...]:
    """comfy_kitchen backends that offer `na3d` here (e.g. ("cuda", "triton", "eager")); () if not installed."""
    try:
        import comfy_kitchen
    except ImportError:
        return ()
    listing = comfy_kitchen.registry.list_backends()
    return tuple(name for name, row in listing.items() if row["available"] and not row["disabled"]
                 and "na3d" in row["capabilities"])


def natten_status() -> tuple[bool, bool]:
    """(importable, has libnatten — its compiled CUDA kernels)."""
    try:
        import natten
    except ImportError:
        return False, False
    return True, bool(getattr(natten, "HAS_LIBNATTEN", False))


def choose_processor(requested: str, device_type: str, ck_backends: tuple[str, ...],
                     natten: tuple[bool, bool]) -> str:
    """`auto` → the fastest measured per window size. On CUDA with comfy_kitchen's fused kernels (its `cuda` or
    `triton` backend): comfy_kitchen for the small windows of stages 1-4 and blocked SDPA for stage 5
    (`comfy_kitchen+sdpa`, see `ByWindowProcessor`); otherwise blocked SDPA (on the CPU comfy_kitchen runs its eager
    path, slower than SDPA). NATTEN's CUDA library was not measured, so auto never picks it; it stays selectable by
    name."""
    if requested != "auto":
        return requested
    if device_type == "cuda" and {"cuda", "triton"} & set(ck_backends):
        return "comfy_kitchen+sdpa"
    return "sdpa"


def make_processor(requested: str, device: torch.device) -> NeighborhoodAttnProcessor:
    """The processor `requested` resolves to on `device`, or an `LTX25Error` saying why it cannot run."""
    if requested not in PROCESSORS:
        raise LTX25Error(WHERE, "the attention processor", repr(requested), " / ".join(PROCESSORS))
    ck, nat = comfy_kitchen_backends(), natten_status()
    name = choose_processor(requested, device.type, ck, nat)
    if name == "sdpa":
        return SdpaNAProcessor()
    if name == "comfy_kitchen+sdpa":
        return ByWindowProcessor(ComfyKitchenNAProcessor(), SdpaNAProcessor())
    if name == "natten":
        if not nat[0]:
            raise LTX25Error(WHERE, "natten", "not installed", "an importable natten package",
                             "pip install natten (build with NATTEN_CUDA_ARCH set for GPU kernels), or pick sdpa.")
        if device.type == "cuda" and not nat[1]:
            raise LTX25Error(WHERE, "natten", "installed without libnatten (flex attention only)",
                             "a build with its CUDA kernels",
                             "Uncompiled flex materializes the full score matrix (hundreds of GiB at real sizes). "
                             "Rebuild natten with NATTEN_CUDA_ARCH=9.0 on this machine, or pick comfy_kitchen/sdpa.")
        return NattenNAProcessor()
    if not ck:
        raise LTX25Error(WHERE, "comfy_kitchen", "not installed (or offers no na3d)", "comfy-kitchen with na3d",
                         "pip install comfy-kitchen, or pick sdpa.")
    return ComfyKitchenNAProcessor()


def install_processor(model: torch.nn.Module, processor: NeighborhoodAttnProcessor) -> None:
    """Set `processor` on every neighborhood-attention module of a diffusers model (`set_attn_processor`)."""
    model.set_attn_processor(processor)

