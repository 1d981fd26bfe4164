"""3-D neighborhood-attention processors for diffusers' `LTX2VideoVaeNeighborhoodAttention` (the diffusion VAE).

Each processor is a diffusers attention processor installed with `set_attn_processor`: it takes Q/K/V as the
module's own `project_qkv` computes them (RMS-normed, query pre-scaled by 1/sqrt(head_dim), 3-D RoPE; `project_qkv`
here does the rotation in fewer passes) and runs the window attention with `scale=1.0`. Window per axis: exactly `k`
keys starting at `clamp(i − k//2, 0, L − k)` — shifted inward at borders, never truncated (NATTEN `na3d` semantics;
docs/MODEL.md §10.2).

- `sdpa`: exact neighborhood attention on PyTorch SDPA: spatial query blocks with their gathered key region, and
  frame windows as strided views of it (`na3d_sdpa`); the reference the others are tested against; CPU and GPU;
  memory bounded by the gather chunk.
- `natten`: a local `natten.na3d` (never fetched from the Hub).
- `comfy_kitchen`: `comfy_kitchen.na3d` (fused CUDA/Triton kernels on the GPU, its eager path on the CPU).
- `triton`: our fused kernel (`na_triton`), keys read in place, one window-masked flash pass; CUDA only.
- `auto`: the fastest available on the device, per window size (`ByWindowProcessor`).
An unavailable backend is an `LTX25Error`, never a silent fallback.
"""
from __future__ import annotations

import functools
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .. import compat
from ..errors import LTX25Error

PROCESSORS = ("auto", "sdpa", "natten", "comfy_kitchen", "triton")
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
def _plan(dims: tuple[int, int, int], kernel: tuple[int, int, int], block: tuple[int, int], device: str):
    """Spatial key-region shape and, per spatial geometry group, (query block shape `(h, w)`, runs along H and W,
    spatial mask `[h·w, region_h·region_w]` or None when every window covers the whole region). Cached: all blocks of
    a decoder stage (and all tiles of one size) attend over the same grid."""
    (_, kh, kw), (_, height, width) = kernel, dims
    (region_h, classes_h), (region_w, classes_w) = (_axis_classes(n, k, min(b, n)) for n, k, b in
                                                    zip((height, width), (kh, kw), block))
    groups = []
    for ((qh, rel_h), runs_h), ((qw, rel_w), runs_w) in itertools.product(classes_h.items(), classes_w.items()):
        masks = []
        for rel, region, k in ((rel_h, region_h, kh), (rel_w, region_w, kw)):
            starts = torch.tensor(rel)[:, None]
            keys = torch.arange(region)[None, :]
            masks.append((keys >= starts) & (keys < starts + k))               # [q_len, region]
        visible = (masks[0][:, None, :, None] & masks[1][None, :, None, :]).reshape(qh * qw, region_h * region_w)
        groups.append(((qh, qw), (runs_h, runs_w), None if bool(visible.all()) else visible.to(device)))
    return (region_h, region_w), groups


def _bias(visible: torch.Tensor | None, slabs: int, query_repeats: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive `[repeats·Nq, slabs·Nk]` bias (0 / −inf) of a spatial mask, the same for every frame slab of the keys
    and every frame of the queries; rows padded to 16 elements (SDPA's kernels want aligned strides)."""
    if visible is None:
        return None
    visible = visible.repeat(query_repeats, slabs)
    n_q, n_k = visible.shape
    bias = torch.zeros(n_q, -(-n_k // 16) * 16, dtype=dtype, device=visible.device)[:, :n_k]
    return bias.masked_fill_(~visible, float("-inf"))


def _token_index(runs: tuple[_Run, _Run], shape: tuple[int, int], dims: tuple[int, int, int], batch: int,
                 keys: bool, device: torch.device) -> torch.Tensor:
    """Flat token indices `[B, Gh, Gw, T, h, w]` of the spatial query blocks (or their key regions) of `runs`, every
    frame, in a `[B, T, H, W]` grid. Gathering by index copies whole `heads·D` rows with one vectorized kernel."""
    axes = []
    for run, n in zip(runs, shape):
        start, step = (run.r0, run.r_step) if keys else (run.q0, run.q_step)
        axes.append(start + step * torch.arange(run.count, device=device)[:, None] + torch.arange(n, device=device))
    (h, w), (frames, height, width) = axes, dims
    frame = torch.arange(batch * frames, device=device).view(batch, 1, 1, frames, 1, 1)  # b·T + t
    grid = (frame * height + h[None, :, None, None, :, None]) * width
    return (grid + w[None, None, :, None, None, :]).reshape(-1)


def default_query_block(kernel: tuple[int, ...], cuda: bool) -> tuple[int, int]:
    """Spatial query block `(h, w)`. GPU: 8×16 — 128 queries per frame; at k = 11 the gathered keys are
    18·26/128 ≈ 3.7× the keys and each query scores 18·26/11² ≈ 3.9× its window; of the blocks tried (8×8, 16×16,
    4×8) it ran stage 5 fastest (docs/PERFORMANCE.md).
    CPU (the math kernel materializes every score): about one window."""
    return (8, 16) if cuda else tuple(min(k, 8) for k in kernel[1:])


def na3d_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: tuple[int, int, int],
              query_block: tuple[int, int] | None = None, chunk_elements: int | None = None) -> torch.Tensor:
    """Exact 3-D neighborhood attention with `scale=1.0` (q pre-scaled). `q, k, v`: `[B, T, H, W, heads, D]`.

    Spatially, queries are cut into `query_block` `(h, w)` blocks (default: `default_query_block`) whose keys are the
    union of their windows (`block + k − 1` per axis), gathered by token index for all frames at once:
    `[frames, region]` rows per block. In time nothing is gathered: the keys of a frame's queries are the `k_t`
    consecutive frame slabs of that buffer its window starts at, so every interior frame of every block is one
    batch entry of a single SDPA call over an overlapping strided view, and the border frames (whose window is
    shifted inward) two more calls. Blocks whose spatial windows sit alike relative to their region share one
    mask; work runs in chunks of at most `chunk_elements` gathered key elements (on the CPU the math kernel also
    materializes the scores).
    """
    b, t, h, w, heads, dim = q.shape
    dims, (kt, kh, kw) = (t, h, w), kernel_size
    if any(kk > n for kk, n in zip(kernel_size, dims)):
        raise LTX25Error(WHERE, "the attention grid (T, H, W)", dims, f"at least the kernel {tuple(kernel_size)}")
    if chunk_elements is None:
        chunk_elements = CUDA_CHUNK if q.is_cuda else CPU_CHUNK
    rows = [x.reshape(b * t * h * w, heads * dim) for x in (q, k, v)]           # one row per token
    query_block = query_block or default_query_block(kernel_size, q.is_cuda)
    (region_h, region_w), groups = _plan(dims, tuple(kernel_size), tuple(query_block), str(q.device))
    slab = region_h * region_w                                                  # key rows per block and frame
    lead = kt // 2                                                              # frames [lead, last] are centered
    last_interior = t - kt + lead
    tail = t - 1 - last_interior
    out = torch.empty(b * t * h * w, heads * dim, dtype=v.dtype, device=v.device)
    row = heads * dim
    for (qh, qw), (runs_h, runs_w), visible in groups:
        n_q = qh * qw
        bias_inner, bias_lead, bias_tail = (_bias(visible, kt, repeats, q.dtype) for repeats in (1, lead, tail))
        per_block = b * t * slab * row + (0 if q.is_cuda else b * t * n_q * kt * slab * heads)
        for rh, rw in itertools.product(runs_h, runs_w):
            step_w = max(1, min(rw.count, chunk_elements // per_block))
            step_h = max(1, min(rh.count, chunk_elements // (per_block * step_w)))
            for h0, w0 in itertools.product(range(0, rh.count, step_h), range(0, rw.count, step_w)):
                part = (rh.part(h0, min(step_h, rh.count - h0)), rw.part(w0, min(step_w, rw.count - w0)))
                g = b * part[0].count * part[1].count                           # blocks (with the batch) this chunk
                q_index = _token_index(part, (qh, qw), dims, b, False, q.device)
                k_index = _token_index(part, (region_h, region_w), dims, b, True, q.device)
                qs = rows[0].index_select(0, q_index)                           # [g·T·n_q, row]
                ks, vs = rows[1].index_select(0, k_index), rows[2].index_select(0, k_index)  # [g·T·slab, row]
                o = torch.empty_like(qs)

                def attend(frame0: int, frames: int, count: int, key_frame0: int, key_step: int, repeats: int,
                           bias: torch.Tensor | None) -> None:
                    """`count` batch entries; entry i: queries of `repeats` frames from frame `frame0 + i·frames`,
                    keys `kt` slabs from slab `key_frame0 + i·key_step` (frame counts in the gathered buffers)."""
                    n = repeats * n_q
                    view_q = qs.as_strided((count, heads, n, dim), (frames * n_q * row, dim, row, 1),
                                           frame0 * n_q * row)
                    view_k, view_v = (x.as_strided((count, heads, kt * slab, dim), (key_step * slab * row, dim, row, 1),
                                                   key_frame0 * slab * row) for x in (ks, vs))
                    result = F.scaled_dot_product_attention(view_q, view_k, view_v, attn_mask=bias, scale=1.0)
                    o.as_strided((count, n, heads, dim), (frames * n_q * row, row, dim, 1),
                                 frame0 * n_q * row).copy_(result.transpose(1, 2))

                # interior frames of all blocks at once: entry u = block·T + frame, keys from slab u − kt//2;
                # entries at a block's edge frames read a neighbour's slabs and are redone by the calls below
                count = g * t - (kt - 1)
                attend(lead, 1, count, 0, 1, 1, bias_inner)
                if lead:             # frames [0, kt//2) all attend to slabs [0, kt)
                    attend(0, t, g, 0, t, lead, bias_lead)
                if tail:             # frames (last_interior, T) all attend to slabs [T − kt, T)
                    attend(last_interior + 1, t, g, t - kt, t, tail, bias_tail)
                out.index_copy_(0, q_index, o)
    return out.view(b, t, h, w, heads, dim)


def _rotate(x: torch.Tensor, rope, scale: float) -> torch.Tensor:
    """diffusers' `LTX2VideoVaeRotaryPosEmbed3D(x) * scale`: each axis chunk's (even, odd) pairs rotated in float32 by
    its position's angles, then cast back. One float32 copy rotated in place by one complex multiply per axis,
    instead of ~10 full-size passes and a concat per tensor.
    `scale` (a power of two: the query's 1/√64) is folded into the rotation, which is exact."""
    rotated = x.float()
    pairs = torch.view_as_complex(rotated.view(*x.shape[:-1], x.shape[-1] // 2, 2))
    start = 0
    for axis, dim in enumerate(rope.rope_dim_split):
        length = x.shape[1 + axis]
        positions = torch.arange(length, dtype=torch.float32, device=x.device)
        angles = positions[:, None] * compat.rope_inv_freqs(rope, dim, x.device)[None, :]
        shape = [1, 1, 1, 1, 1, dim // 2]
        shape[1 + axis] = length
        pairs[..., start:start + dim // 2].mul_(torch.polar(torch.full_like(angles, scale), angles).view(shape))
        start += dim // 2
    return rotated.to(x.dtype)


def folds_scale(head_dim: int) -> bool:
    """Whether the query's 1/√D is a power of two, so the rotation can carry it exactly (`_rotate`, `norm_rope`)."""
    return math.log2(head_dim ** -0.5).is_integer()


def project_qkv(attn, hidden_states: torch.Tensor, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    """`attn.project_qkv` (diffusers' `LTX2VideoVaeNeighborhoodAttention`): Q/K/V `[B, T, H, W, heads, D]`,
    RMS-normed, query × 1/√D, 3-D RoPE — with the rotation of `_rotate`, or with `fused` (the `triton` processor)
    `na_triton.norm_rope`: norm and rotation in one float32 pass. Falls back to the module's own method when its
    scale is not a power of two (folding it would round differently)."""
    if not folds_scale(attn.head_dim):
        return attn.project_qkv(hidden_states)
    shape = (*hidden_states.shape[:4], attn.heads, attn.head_dim)
    if fused:  # one projection for q|k|v (the hidden state is read once), then norm + RoPE in place on q and k
        from . import na_triton
        projections = (attn.to_q, attn.to_k, attn.to_v)
        bias = torch.cat([p.bias for p in projections])  # diffusers builds all three with a bias
        qkv = F.linear(hidden_states, torch.cat([p.weight for p in projections]), bias)
        query, key, value = qkv.view(*shape[:4], 3, *shape[4:]).unbind(4)
        return (na_triton.norm_rope(query, attn.norm_q, attn.rope, attn.scale, in_place=True),
                na_triton.norm_rope(key, attn.norm_k, attn.rope, 1.0, in_place=True), value)
    query, key = attn.to_q(hidden_states).view(shape), attn.to_k(hidden_states).view(shape)
    value = attn.to_v(hidden_states).view(shape)
    return _rotate(attn.norm_q(query), attn.rope, attn.scale), _rotate(attn.norm_k(key), attn.rope, 1.0), value


class NeighborhoodAttnProcessor:
    """Base: `project_qkv` → `na3d(q, k, v, kernel)` → `to_out`. Subclasses supply `na3d` and `name`;
    `fused_projection` and `fused_block` only where the Triton kernels are known to run, so the others stay a
    reference for them."""
    name = ""
    fused_projection = False
    fused_block = False  # stage 5's blocks with fused norm·modulation and SwiGLU passes (fused_block.py)

    def scratch_bytes(self, element_bytes: int, cuda: bool) -> int:
        """Memory one call needs beyond its inputs and output (the tile planner adds it)."""
        return 0

    def na3d(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: tuple[int, int, int]) -> torch.Tensor:
        raise NotImplementedError

    def na3d_over_query(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        kernel: tuple[int, int, int]) -> torch.Tensor:
        """`na3d` for a caller that no longer needs q: a processor whose kernel allows it writes the result over q's
        memory (no output tensor); the others return a new one."""
        return self.na3d(q, k, v, kernel)

    def __call__(self, attn, hidden_states: torch.Tensor, block_mask=None) -> torch.Tensor:
        batch, frames, height, width, channels = hidden_states.shape
        query, key, value = project_qkv(attn, hidden_states, self.fused_projection)  # [B, T, H, W, heads, D]
        out = self.na3d(query, key, value, tuple(attn.kernel_size))
        return attn.to_out[0](out.reshape(batch, frames, height, width, channels))


def adds_in_place(attn) -> bool:
    """Whether `add_attention_` can run `attn` with chunk-sized temporaries: its processor projects q|k|v at once
    and norms and rotates them in place (`fused_projection`), and the query's scale folds into the rotation."""
    processor = attn.processor
    return isinstance(processor, NeighborhoodAttnProcessor) and processor.fused_projection and \
        folds_scale(attn.head_dim)


def add_attention_(attn, hidden: torch.Tensor, prepare: Callable[[torch.Tensor, int], torch.Tensor],
                   tokens: int) -> None:
    """`hidden += attn(prepare(hidden))` for diffusers' `LTX2VideoVaeNeighborhoodAttention` (`adds_in_place`), with
    `hidden` `[B, T, H, W, C]` (each batch item contiguous) and `prepare(rows, item)` the attention's input for
    `rows` `[n, C]` of batch item `item` (stage 5: the modulated norm). The only full-size tensor made is q|k|v:
    the projection is filled `tokens` rows at a time from prepared rows, q and k are normed and rotated in place,
    the attention is written over q where the processor allows (`na3d_over_query`), and the output projection is
    added `tokens` rows at a time. Same operations and roundings as `attn(prepare(hidden))` through `__call__`."""
    from . import na_triton
    processor, (batch, frames, height, width, channels) = attn.processor, hidden.shape
    projections = (attn.to_q, attn.to_k, attn.to_v)
    weight, bias = torch.cat([p.weight for p in projections]).t(), torch.cat([p.bias for p in projections])
    qkv = torch.empty(batch, frames, height, width, 3, attn.heads, attn.head_dim, dtype=hidden.dtype,
                      device=hidden.device)
    rows, qkv_rows = hidden.view(batch, -1, channels), qkv.view(batch, -1, 3 * channels)
    for item, start in itertools.product(range(batch), range(0, rows.shape[1], tokens)):
        torch.addmm(bias, prepare(rows[item, start:start + tokens], item), weight,
                    out=qkv_rows[item, start:start + tokens])
    query, key, value = qkv.unbind(4)                                           # [B, T, H, W, heads, D] views
    na_triton.norm_rope(query, attn.norm_q, attn.rope, attn.scale, in_place=True)
    na_triton.norm_rope(key, attn.norm_k, attn.rope, 1.0, in_place=True)
    out = processor.na3d_over_query(query, key, value, tuple(attn.kernel_size)).view(batch, -1, channels)
    del query, key, value, qkv, qkv_rows  # q|k|v goes now, unless the attention was written over q
    for item, start in itertools.product(range(batch), range(0, rows.shape[1], tokens)):
        rows[item, start:start + tokens] += attn.to_out[0](out[item, start:start + tokens])


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


class TritonNAProcessor(NeighborhoodAttnProcessor):
    name = "triton"
    fused_projection = True
    fused_block = True

    def __init__(self, config: "na_triton.KernelConfig | None" = None) -> None:  # noqa: F821 - imported lazily
        from . import na_triton
        self._na_triton, self.config = na_triton, config or na_triton.DEFAULT_CONFIG

    def na3d(self, q, k, v, kernel):
        return self._na_triton.na3d_triton(q, k, v, kernel, self.config)

    def na3d_over_query(self, q, k, v, kernel):
        # each program reads its own query rows before it writes their outputs, and no other program reads them
        return self._na_triton.na3d_triton(q, k, v, kernel, self.config, out=q)


class ByWindowProcessor(NeighborhoodAttnProcessor):
    """Routes each call by window volume: windows of at most `max_small` keys to `small`, larger ones to `large`.
    comfy_kitchen's fused kernel beats blocked SDPA on the deterministic stages' 3×7×7 and 3×5×5 windows, and
    blocked SDPA beats it on stage 5's 11×11×11 (docs/PERFORMANCE.md)."""

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
                     natten: tuple[bool, bool], triton: bool) -> str:
    """`auto` → the fastest processor available (ranking in docs/PERFORMANCE.md). On CUDA: our Triton kernel where
    it runs (Triton, an NVIDIA GPU of Ampere or newer, a first launch that compiled) — ahead of blocked SDPA on stage
    5's 11³ window and of comfy_kitchen's fused kernel on the 3×7×7 and 3×5×5 ones. Otherwise on CUDA
    comfy_kitchen's `cuda` or `triton` backend for the small windows of stages 1-4 and blocked SDPA for stage 5
    (`comfy_kitchen+sdpa`, see
    `ByWindowProcessor`); else blocked SDPA (on the CPU comfy_kitchen runs its eager path, slower than SDPA).
    NATTEN's CUDA library was not measured, so auto never picks it; it stays selectable by name."""
    if requested != "auto":
        return requested
    if device_type == "cuda" and triton:
        return "triton"
    if device_type == "cuda" and {"cuda", "triton"} & set(ck_backends):
        return "comfy_kitchen+sdpa"
    return "sdpa"


def make_processor(requested: str, device: torch.device, where: str = WHERE) -> NeighborhoodAttnProcessor:
    """The processor `requested` resolves to on `device`, or an `LTX25Error` naming `where` (the node's input) and
    saying why it cannot run. NATTEN runs only with its CUDA kernels: elsewhere it falls back to uncompiled flex
    attention, which holds every score of a call at once (gigabytes for a small clip, tens of GB beyond, some 20×
    sdpa's memory) and cannot be interrupted, so it is refused rather than left to exhaust memory."""
    if requested not in PROCESSORS:
        raise LTX25Error(where, "the attention processor", repr(requested), " / ".join(PROCESSORS))
    from . import na_triton
    ck, nat = comfy_kitchen_backends(), natten_status()
    # asked only when it may be picked: its first launch compiles a kernel
    triton_ok, triton_why = na_triton.available(device) if requested in ("auto", "triton") else (False, "")
    name = choose_processor(requested, device.type, ck, nat, triton_ok)
    if name == "sdpa":
        return SdpaNAProcessor()
    if name == "comfy_kitchen+sdpa":
        return ByWindowProcessor(ComfyKitchenNAProcessor(), SdpaNAProcessor())
    if name == "triton":
        if not triton_ok:
            raise LTX25Error(where, "the triton processor", f"unavailable here ({triton_why})",
                             "Triton and a CUDA GPU (Ampere or newer)", "Pick sdpa (any device) or auto.")
        return TritonNAProcessor()
    if name == "natten":
        if not nat[0]:
            raise LTX25Error(where, "the natten processor", "not installed", "an importable natten package",
                             "pip install natten (build with NATTEN_CUDA_ARCH set for GPU kernels), or pick sdpa.")
        if device.type != "cuda":
            raise LTX25Error(where, "the natten processor", f"asked to run on the {device.type}",
                             "a CUDA GPU (NATTEN's kernels are CUDA only)",
                             "On the CPU natten falls back to uncompiled flex attention, which holds every attention "
                             "score at once: gigabytes and minutes for a 128×128×9 clip, tens of GB beyond, and it "
                             "cannot be interrupted. Pick sdpa (or auto): exact, the same video, far faster here.")
        if not nat[1]:
            raise LTX25Error(where, "the natten processor", "installed without libnatten (flex attention only)",
                             "a build with its CUDA kernels",
                             "Uncompiled flex materializes the full score matrix (hundreds of GiB at real sizes). "
                             "Rebuild natten with NATTEN_CUDA_ARCH=9.0 on this machine, or pick comfy_kitchen/sdpa.")
        return NattenNAProcessor()
    if not ck:
        raise LTX25Error(where, "the comfy_kitchen processor", "not installed (or offers no na3d)",
                         "comfy-kitchen with na3d", "pip install comfy-kitchen, or pick sdpa.")
    return ComfyKitchenNAProcessor()


def install_processor(model: torch.nn.Module, processor: NeighborhoodAttnProcessor) -> None:
    """Set `processor` on every neighborhood-attention module of a diffusers model (`set_attn_processor`)."""
    model.set_attn_processor(processor)

