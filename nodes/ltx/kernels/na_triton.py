"""Fused 3-D neighborhood attention in Triton: the `triton` processor's kernel.

Why our own kernel: stage 5's 11×11×11 window is where the diffusion decoder spends its time, and no kernel we can
ship runs it well — comfy-kitchen's fused `na3d` is slower than blocked SDPA there, and NATTEN's CUDA library
must be built on the user's machine. Blocked SDPA (`na3d_sdpa`) first copies each query block's key region (3.7×
the keys) and then scores a 3.9× superset of every window.

This kernel reads keys straight from the `[B, T, H, W, heads, D]` tensors. One program takes a 3-D query tile
(`tile` = (t, h, w) queries) of one (batch, head); the union of its queries' windows lies in a box of
`(t + k_t − 1) × (h + k_h − 1) × (w + k_w − 1)` keys (clipped to the grid; one shape for every program), enumerated
in blocks of `block_n` tokens loaded by address (each token's head slice is one contiguous row), scored with
`tl.dot`, and masked per query to its own window with an online softmax (flash attention). Windows follow
`window_start`: exactly `k` keys from `clamp(i − k//2, 0, L − k)` per axis, shifted inward at the borders, never
truncated. At 4×4×8 query tiles and k = 11 each query scores 14·14·18 = 3528 keys for its 1331 (2.65×), with
nothing gathered.

The window mask runs on the tensor cores. Testing each score against the query's window (three subtractions and
compares, ands, a select) took about half of stage 5's kernel time (docs/PERFORMANCE.md). Instead
each key carries a one-hot of its box coordinate per axis (`_key_onehots`, the same table for every program, since
the box has one shape) and each query a row that is 0 at the coordinates inside its window and −`FAR` outside; their
product, accumulated into the same `tl.dot` as q·k, adds exactly 0 to the window's scores (sums of exact zeros) and
at least `FAR` below to every other, whose exp2 is then exactly 0.

Exactness is tested against the dense window-masked reference with Triton's interpreter on the CPU
(`TRITON_INTERPRET=1`, tests/test_na_triton.py); on the GPU the compiled kernel runs.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass

import torch

from .. import compat, compile_cache
from ..errors import LTX25Error

try:  # optional: the kernel needs Triton (shipped with CUDA builds of torch); importing this module does not
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

WHERE = "processor"


@dataclass(frozen=True)
class KernelConfig:
    """Launch shape: query tile (t, h, w) — its product is the queries per program — key block, warps, stages.
    The default was the fastest shape on stage 5 and near the best on stages 1-4 in a launch sweep
    (bench/bench_na_kernel.py; figures in docs/PERFORMANCE.md)."""
    tile: tuple[int, int, int] = (4, 4, 8)
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name, value in (("tile product", self.tile[0] * self.tile[1] * self.tile[2]), ("block_n", self.block_n)):
            if value < 16 or value & (value - 1):  # tl.arange and tl.dot need powers of two of at least 16
                raise ValueError(f"KernelConfig {name} is {value}; expected a power of two ≥ 16")


DEFAULT_CONFIG = KernelConfig()


def available(device: torch.device) -> tuple[bool, str]:
    """(usable, why not): Triton, an NVIDIA GPU of compute capability ≥ 8.0, and a first launch that compiled and
    ran (Triton can import yet fail to build, e.g. without a C compiler). On the CPU only Triton's interpreter runs
    the kernels, for tests."""
    if triton is None:
        return False, "Triton is not installed"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, f"the device is {device.type} without a usable GPU; the kernel needs CUDA"
    if torch.version.hip is not None:
        return False, "the GPU is an AMD (ROCm) one; the kernel was only built and measured on NVIDIA"
    if torch.cuda.get_device_capability(device) < (8, 0):  # Triton's bf16 tl.dot needs Ampere or newer
        return False, f"{torch.cuda.get_device_name(device)} is older than Ampere (compute capability 8.0)"
    return _first_launch(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _first_launch(index: int) -> tuple[bool, str]:
    try:
        q = torch.randn(1, 3, 4, 4, 1, 16, device=f"cuda:{index}", dtype=torch.bfloat16)
        na3d_triton(q, q, q, (3, 3, 3))
        torch.cuda.synchronize(index)
    except Exception as error:  # noqa: BLE001 - any build or launch failure makes the kernel unusable here
        return False, f"its first launch failed ({type(error).__name__}: {str(error)[:200]})"
    return True, ""


def _define_kernel():
    """The kernel, defined only where Triton imports. (Module level, not a closure: Triton's interpreter patches
    `tl` in the kernel's globals.)"""
    @triton.jit
    def na3d_fwd(q_ptr, k_ptr, v_ptr, o_ptr, onehot_ptr,
                 T, H, W, heads, LT, LH, LW,
                 s_b, s_t, s_h, s_w, s_head,
                 o_b, o_t, o_h, o_w, o_head,
                 KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                 QT: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
                 ST: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, ENC: tl.constexpr, FAR: tl.constexpr,
                 D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
        BLOCK_M: tl.constexpr = QT * QH * QW
        tile = tl.program_id(0)
        b = tl.program_id(1) // heads
        head = tl.program_id(1) % heads
        tiles_w = (W + QW - 1) // QW
        tiles_h = (H + QH - 1) // QH
        t0 = (tile // (tiles_w * tiles_h)) * QT
        h0 = ((tile // tiles_w) % tiles_h) * QH
        w0 = (tile % tiles_w) * QW

        m = tl.arange(0, BLOCK_M)
        qt = t0 + m // (QH * QW)
        qh = h0 + (m // QW) % QH
        qw = w0 + m % QW
        q_valid = (qt < T) & (qh < H) & (qw < W)
        # rows past the grid's edge take the last row's window, so no row is empty (no 0/0) — they are not stored
        qt = tl.minimum(qt, T - 1)
        qh = tl.minimum(qh, H - 1)
        qw = tl.minimum(qw, W - 1)
        start_t = tl.minimum(tl.maximum(qt - KT // 2, 0), T - KT)
        start_h = tl.minimum(tl.maximum(qh - KH // 2, 0), H - KH)
        start_w = tl.minimum(tl.maximum(qw - KW // 2, 0), W - KW)
        # the key box (LT × LH × LW): window starts are monotonic in the query, so it starts at the first query's
        # window, moved back where it would pass the grid's end
        box_t = tl.minimum(tl.minimum(tl.maximum(t0 - KT // 2, 0), T - KT), T - LT)
        box_h = tl.minimum(tl.minimum(tl.maximum(h0 - KH // 2, 0), H - KH), H - LH)
        box_w = tl.minimum(tl.minimum(tl.maximum(w0 - KW // 2, 0), W - KW), W - LW)
        keys = LT * LH * LW

        d = tl.arange(0, D_PAD)
        d_valid = d < D
        base = b.to(tl.int64) * s_b + head * s_head
        q_rows = base + qt.to(tl.int64) * s_t + qh * s_h + qw * s_w
        q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=d_valid[None, :], other=0.0)
        # the query's side of the mask: columns [0, ST) are box frames, [ST, ST + SH) rows, [ST + SH, ...) columns
        c = tl.arange(0, ENC)
        in_t = ((c[None, :] - (start_t - box_t)[:, None]).to(tl.uint32) < KT) & (c < ST)[None, :]
        in_h = ((c[None, :] - ST - (start_h - box_h)[:, None]).to(tl.uint32) < KH) & (c >= ST)[None, :]
        in_w = ((c[None, :] - ST - SH - (start_w - box_w)[:, None]).to(tl.uint32) < KW) & (c >= ST + SH)[None, :]
        window = tl.where(in_t | in_h | in_w | (c >= ST + SH + SW)[None, :], 0.0, -FAR).to(q.dtype)

        LOG2E: tl.constexpr = 1.4426950408889634
        # a key block may hold none of a row's window keys: its scores then count until a block that does, whose
        # larger maximum (by at least FAR) rescales them to exactly 0
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        for first in range(0, keys, BLOCK_N):
            n = first + tl.arange(0, BLOCK_N)
            k_valid = n < keys
            kt = box_t + n // (LH * LW)
            kh = box_h + (n // LW) % LH
            kw = box_w + n % LW
            k_rows = base + kt.to(tl.int64) * s_t + kh * s_h + kw * s_w
            k_mask = k_valid[:, None] & d_valid[None, :]
            k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=k_mask, other=0.0)
            v = tl.load(v_ptr + k_rows[:, None] + d[None, :], mask=k_mask, other=0.0)
            onehots = tl.load(onehot_ptr + n[:, None] * ENC + c[None, :])
            scores = tl.dot(q, tl.trans(k), acc=tl.dot(window, tl.trans(onehots), input_precision=PRECISION),
                            input_precision=PRECISION)
            m_new = tl.maximum(m_i, tl.max(scores, 1) * LOG2E)
            p = tl.exp2(scores * LOG2E - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        o_rows = b.to(tl.int64) * o_b + head * o_head + qt.to(tl.int64) * o_t + qh * o_h + qw * o_w
        tl.store(o_ptr + o_rows[:, None] + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=q_valid[:, None] & d_valid[None, :])

    return na3d_fwd


def _define_norm_rope_kernel():
    @triton.jit
    def norm_rope(x_ptr, o_ptr, weight_ptr, cos_ptr, sin_ptr, axis_ptr, rows, T, H, W, heads, eps, scale, x_token,
                  o_token, positions, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)          # row = token · heads + head
        token = r // heads
        pos_w = token % W
        pos_h = (token // W) % H
        pos_t = (token // (W * H)) % T
        d = tl.arange(0, D_PAD)
        mask = (r < rows)[:, None] & (d < D)[None, :]
        row_at = (token.to(tl.int64) * x_token + (r % heads) * D)[:, None] + d[None, :]  # whole rows: coalesced
        x = tl.load(x_ptr + row_at, mask=mask, other=0.0).to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
        x = x * inv_rms[:, None] * tl.load(weight_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
        even, odd = tl.split(tl.reshape(x, (BLOCK_R, D_PAD // 2, 2)))    # rotation pair p: elements 2p, 2p + 1
        p = tl.arange(0, D_PAD // 2)
        axis = tl.load(axis_ptr + p, mask=p < D // 2, other=0)[None, :]
        position = tl.where(axis == 0, pos_t[:, None], tl.where(axis == 1, pos_h[:, None], pos_w[:, None]))
        at = p[None, :] * positions + position  # from tables: libdevice's exact sin and cos here bound the pass
        pair_mask = (r < rows)[:, None] & (p < D // 2)[None, :]
        cos = tl.load(cos_ptr + at, mask=pair_mask, other=0.0) * scale
        sin = tl.load(sin_ptr + at, mask=pair_mask, other=0.0) * scale
        out = tl.reshape(tl.join(even * cos - odd * sin, even * sin + odd * cos), (BLOCK_R, D_PAD))
        out_at = (token.to(tl.int64) * o_token + (r % heads) * D)[:, None] + d[None, :]
        tl.store(o_ptr + out_at, out.to(o_ptr.dtype.element_ty), mask=mask)

    return norm_rope


_kernel = _define_kernel() if triton is not None else None
_norm_rope_kernel = _define_norm_rope_kernel() if triton is not None else None


_ROPE_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _rope_tables(rope, device: torch.device, positions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per rotation pair p and position i < `positions` (or more): cos and sin of `i · freq[p]` in float32 (the
    module's own frequencies, the product `_rotate` takes), `[pairs, positions]`; and per pair its axis (0 = T,
    1 = H, 2 = W). Built once per module and device, and again only for a longer axis."""
    per_device = _ROPE_TABLES.setdefault(rope, {})
    if device not in per_device or per_device[device][0].shape[1] < positions:
        freqs = torch.cat([compat.rope_inv_freqs(rope, dim, device) for dim in rope.rope_dim_split]).float()
        axes = torch.cat([torch.full((dim // 2,), axis, dtype=torch.int32, device=device)
                          for axis, dim in enumerate(rope.rope_dim_split)])
        angles = freqs[:, None] * torch.arange(positions, dtype=torch.float32, device=device)[None, :]
        per_device[device] = (angles.cos().contiguous(), angles.sin().contiguous(), axes)
    return per_device[device]


def norm_rope(x: torch.Tensor, norm: torch.nn.RMSNorm, rope, scale: float, block_rows: int = 64,
              in_place: bool = False) -> torch.Tensor:
    """`_rotate(norm(x), rope, scale)` of na_attention in one pass: `x` `[B, T, H, W, heads, D]` (a projection's
    output) RMS-normed over D with the module's weight and eps, rotated by diffusers' 3-D RoPE at the tensor's own
    positions, times `scale`; all in float32 with one rounding to x's dtype at the end (the unfused path rounds
    after the norm too). The unfused path made five full passes over q and k. Rows are loaded whole and split
    into pairs in registers: loading the even and odd elements as two strided streams used a small fraction of
    the memory bandwidth.

    `x` may be a view with its tokens evenly strided (q or k of one fused q|k|v projection): it is read in place,
    and with `in_place` written back there (no copy of the projection)."""
    if _norm_rope_kernel is None:
        raise LTX25Error(WHERE, "triton", "not installed", "Triton (it comes with CUDA builds of torch)")
    b, t, h, w, heads, dim = x.shape
    token_stride = x.stride(3)
    if x.stride()[3:] != (token_stride, dim, 1) or x.stride()[:3] != (t * h * w * token_stride, h * w * token_stride,
                                                                        w * token_stride):
        x = x.contiguous()
        token_stride = heads * dim
    cos, sin, axes = _rope_tables(rope, x.device, max(t, h, w))
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    weight = norm.weight if norm.weight is not None else torch.ones(dim, device=x.device)
    out = x if in_place else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x.numel() // dim
    with on_device(x.device):
        _norm_rope_kernel[(-(-rows // block_rows),)](x, out, weight, cos, sin, axes, rows, t, h, w, heads,
                                                     float(eps), float(scale), token_stride, out.stride(3),
                                                     cos.shape[1], dim, max(4, triton.next_power_of_2(dim)),
                                                     block_rows)
    return out


def na3d_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: tuple[int, int, int],
                config: KernelConfig = DEFAULT_CONFIG, out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact 3-D neighborhood attention with `scale=1.0` (q pre-scaled). `q, k, v`: `[B, T, H, W, heads, D]`,
    each with its last axis contiguous and k, v strided alike (diffusers' projections are). Returns a contiguous
    tensor of q's shape and v's dtype, or writes into `out` (q's shape and v's dtype, last axis contiguous) and
    returns it. `out` may be q itself: a program loads its query rows once, before it stores their outputs, and
    no other program reads them (a query row belongs to one tile and one head)."""
    b, t, h, w, heads, dim = q.shape
    if any(kk > n for kk, n in zip(kernel_size, (t, h, w))):
        raise LTX25Error(WHERE, "the attention grid (T, H, W)", (t, h, w), f"at least the kernel {tuple(kernel_size)}")
    if out is None:
        out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != v.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {tuple(q.shape)} {v.dtype} tensor with a contiguous last axis")
    if not (q.stride() == k.stride() == v.stride() and q.stride(-1) == 1):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    qt, qh, qw = config.tile
    grid = (-(-t // qt) * -(-h // qh) * -(-w // qw), b * heads)
    if _kernel is None:
        raise LTX25Error(WHERE, "triton", "not installed", "Triton (it comes with CUDA builds of torch)")
    box = tuple(min(tile + kk - 1, n) for tile, kk, n in zip(config.tile, kernel_size, (t, h, w)))
    sections = _onehot_sections(config.tile, kernel_size)
    onehots = _key_onehots(box, sections, config.block_n, q.dtype, q.device)
    with on_device(q.device):
        _kernel[grid](q, k, v, out, onehots, t, h, w, heads, *box, *q.stride()[:5], *out.stride()[:5],
                      *kernel_size, qt, qh, qw, *sections, onehots.shape[1], _FAR[q.dtype],
                      dim, max(16, triton.next_power_of_2(dim)), config.block_n,
                      "ieee" if q.dtype == torch.float32 else "tf32",  # float32 stays float32, not TF32
                      num_warps=config.num_warps, num_stages=config.num_stages)
    return out


# how far below the window's scores the others are put: a power of two the dtype holds exactly (fp16 tops out at
# 65504); far beyond any score of normed q·k, so their exp2 underflows to exactly 0
_FAR = {torch.float16: 2.0 ** 15, torch.bfloat16: 2.0 ** 64, torch.float32: 2.0 ** 64}


def _onehot_sections(tile: tuple[int, int, int], kernel_size: tuple[int, int, int]) -> tuple[int, int, int]:
    """Columns of the one-hot per axis: the box's largest length, at least 16 (tl.dot's least K); the frame
    section keeps one more column, outside every window, for the padding keys of the last block."""
    longest = [q + kk - 1 for q, kk in zip(tile, kernel_size)]
    pow2 = triton.next_power_of_2
    return max(16, pow2(longest[0] + 1)), max(16, pow2(longest[1])), max(16, pow2(longest[2]))


@functools.lru_cache(maxsize=64)
def _key_onehots(box: tuple[int, int, int], sections: tuple[int, int, int], block_n: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """The keys' side of the mask, one row per key of the box in the kernel's order (frame-major) padded to whole
    key blocks: 1 at the key's frame, row and column in their sections; padding rows at the spare frame column.
    The same for every program and every call of a shape, so built once."""
    keys = box[0] * box[1] * box[2]
    n = torch.arange(keys, device=device)
    rows, columns = -(-keys // block_n) * block_n, triton.next_power_of_2(sum(sections))
    onehots = torch.zeros(rows, columns, dtype=dtype, device=device)
    onehots[n, n // (box[1] * box[2])] = 1
    onehots[n, sections[0] + (n // box[2]) % box[1]] = 1
    onehots[n, sections[0] + sections[1] + n % box[2]] = 1
    onehots[keys:, box[0]] = 1  # padding keys: the spare frame column, outside every window
    return onehots


def on_device(device: torch.device):
    """Triton launches on the current CUDA device, not the tensors' one: make them the same (several GPUs). Every
    launch of the pack's kernels goes through here, so it is also where Triton's cache folder gets chosen before
    the first kernel compiles (compile_cache.py)."""
    compile_cache.ensure_applied()
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
