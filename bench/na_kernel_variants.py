"""Experiment: where stage 5's window-attention kernel spends its time, by variants of `na_triton`'s kernel.

MASK 0: the per-element window test of the kernel before `2740243` (3 axes × subtract + compare, ands, select);
MASK 1: the window as an additive bias computed on the tensor cores: per axis a one-hot of the key's box
        coordinate times a query row that is 0 inside the query's window and -2^20 outside (dot, acc chained);
MASK 2: no mask at all (wrong numbers; the bound the mask work is measured against);
MASK 3: as 1, the key one-hots read from a table (the box has one shape in every program).
All variants use a box of one shape per launch. The kernel here is a frozen copy of `na_triton`'s as it was when
the variants were measured (docs/PERFORMANCE.md, sixth round), kept so those numbers can be re-run; the pack runs
`na_triton`'s (MASK 4's scheme).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_na_kernel import timed  # noqa: E402

from nodes.ltx import na_triton  # noqa: E402

BIG = 2.0 ** 20


def _p2(x: int) -> int:
    return 1 << (max(x, 1) - 1).bit_length()


@triton.jit
def na3d_var(q_ptr, k_ptr, v_ptr, o_ptr, enc_ptr, off_ptr,
             T, H, W, heads, LT, LH, LW,
             s_b, s_t, s_h, s_w, s_head,
             o_b, o_t, o_h, o_w, o_head,
             KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
             QT: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
             ST: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, LTM: tl.constexpr, ENC: tl.constexpr,
             D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr):
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
    qt = tl.minimum(qt, T - 1)
    qh = tl.minimum(qh, H - 1)
    qw = tl.minimum(qw, W - 1)
    start_t = tl.minimum(tl.maximum(qt - KT // 2, 0), T - KT)
    start_h = tl.minimum(tl.maximum(qh - KH // 2, 0), H - KH)
    start_w = tl.minimum(tl.maximum(qw - KW // 2, 0), W - KW)
    box_t = tl.minimum(tl.minimum(tl.maximum(t0 - KT // 2, 0), T - KT), T - LT)
    box_h = tl.minimum(tl.minimum(tl.maximum(h0 - KH // 2, 0), H - KH), H - LH)
    box_w = tl.minimum(tl.minimum(tl.maximum(w0 - KW // 2, 0), W - KW), W - LW)
    keys = LT * LH * LW
    d = tl.arange(0, D)
    base = b.to(tl.int64) * s_b + head * s_head
    q_rows = base + qt.to(tl.int64) * s_t + qh * s_h + qw * s_w
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :])
    # query rows of the bias: 0 where the column's box coordinate is inside the query's window, -2^20 outside
    ct = tl.arange(0, ST)
    ch = tl.arange(0, SH)
    cw = tl.arange(0, SW)
    qenc_t = tl.where(((ct[None, :] - (start_t - box_t)[:, None]).to(tl.uint32) < KT), 0.0, -1048576.0).to(q.dtype)
    qenc_h = tl.where(((ch[None, :] - (start_h - box_h)[:, None]).to(tl.uint32) < KH), 0.0, -1048576.0).to(q.dtype)
    qenc_w = tl.where(((cw[None, :] - (start_w - box_w)[:, None]).to(tl.uint32) < KW), 0.0, -1048576.0).to(q.dtype)
    c = tl.arange(0, ENC)
    in_t = ((c[None, :] - (start_t - box_t)[:, None]).to(tl.uint32) < KT) & (c < ST)[None, :]
    in_h = ((c[None, :] - ST - (start_h - box_h)[:, None]).to(tl.uint32) < KH) & ((c >= ST) & (c < ST + SH))[None, :]
    in_w = ((c[None, :] - ST - SH - (start_w - box_w)[:, None]).to(tl.uint32) < KW) & (c >= ST + SH)[None, :]
    qenc = tl.where(in_t | in_h | in_w | (c >= ST + SH + SW)[None, :], 0.0, -1048576.0).to(q.dtype)
    LOG2E: tl.constexpr = 1.4426950408889634
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for first in range(0, keys, BLOCK_N):
        n = first + tl.arange(0, BLOCK_N)
        k_valid = n < keys
        if MASK == 5:
            k_rows = base + box_t.to(tl.int64) * s_t + box_h * s_h + box_w * s_w + tl.load(off_ptr + n)
            k = tl.load(k_ptr + k_rows[:, None] + d[None, :])
            v = tl.load(v_ptr + k_rows[:, None] + d[None, :])
        else:
            rt = n // (LH * LW)
            rh = (n // LW) % LH
            rw = n % LW
            k_rows = base + (box_t + rt).to(tl.int64) * s_t + (box_h + rh) * s_h + (box_w + rw) * s_w
            k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=k_valid[:, None], other=0.0)
            v = tl.load(v_ptr + k_rows[:, None] + d[None, :], mask=k_valid[:, None], other=0.0)
        if MASK == 0:
            scores = tl.dot(q, tl.trans(k))
            inside = ((box_t + rt)[None, :] - start_t[:, None]).to(tl.uint32) < KT
            inside &= ((box_h + rh)[None, :] - start_h[:, None]).to(tl.uint32) < KH
            inside &= ((box_w + rw)[None, :] - start_w[:, None]).to(tl.uint32) < KW
            scores = tl.where(inside & k_valid[None, :], scores, float("-inf"))
        elif MASK == 1:
            rt = tl.where(k_valid, rt, LTM)  # a spare t column: outside every window
            kenc_t = (ct[None, :] == rt[:, None]).to(q.dtype)
            kenc_h = (ch[None, :] == rh[:, None]).to(q.dtype)
            kenc_w = (cw[None, :] == rw[:, None]).to(q.dtype)
            bias = tl.dot(qenc_t, tl.trans(kenc_t))
            bias = tl.dot(qenc_h, tl.trans(kenc_h), acc=bias)
            bias = tl.dot(qenc_w, tl.trans(kenc_w), acc=bias)
            scores = tl.dot(q, tl.trans(k), acc=bias)
        elif MASK == 3:
            kt_ = tl.load(enc_ptr + n[:, None] * ENC + ct[None, :])
            kh_ = tl.load(enc_ptr + n[:, None] * ENC + ST + ch[None, :])
            kw_ = tl.load(enc_ptr + n[:, None] * ENC + ST + SH + cw[None, :])
            bias = tl.dot(qenc_t, tl.trans(kt_))
            bias = tl.dot(qenc_h, tl.trans(kh_), acc=bias)
            bias = tl.dot(qenc_w, tl.trans(kw_), acc=bias)
            scores = tl.dot(q, tl.trans(k), acc=bias)
        elif MASK == 4 or MASK == 5:
            kenc = tl.load(enc_ptr + n[:, None] * ENC + c[None, :])
            scores = tl.dot(q, tl.trans(k), acc=tl.dot(qenc, tl.trans(kenc)))
        else:
            scores = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(scores, 1) * LOG2E)
        p = tl.exp2(scores * LOG2E - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    o_rows = b.to(tl.int64) * o_b + head * o_head + qt.to(tl.int64) * o_t + qh * o_h + qw * o_w
    tl.store(o_ptr + o_rows[:, None] + d[None, :], out.to(o_ptr.dtype.element_ty), mask=q_valid[:, None])


def run(q, k, v, kernel, tile, block_n, warps, stages, mask):
    b, t, h, w, heads, dim = q.shape
    kt, kh, kw = kernel
    qt, qh, qw = tile
    ltm, lhm, lwm = qt + kt - 1, qh + kh - 1, qw + kw - 1
    lt, lh, lw = min(ltm, t), min(lhm, h), min(lwm, w)
    st, sh, sw = max(16, _p2(ltm + 1)), max(16, _p2(lhm)), max(16, _p2(lwm))
    enc = torch.zeros(1, device=q.device, dtype=q.dtype)
    offs = torch.zeros(1, device=q.device, dtype=torch.int64)
    width = _p2(st + sh + sw)
    if mask in (3, 4, 5):
        keys = lt * lh * lw
        n = torch.arange(-(-keys // block_n) * block_n, device=q.device)
        rt, rh, rw = n // (lh * lw), (n // lw) % lh, n % lw
        rt = torch.where(n < keys, rt, ltm)
        enc = torch.zeros(len(n), width, device=q.device, dtype=q.dtype)
        offs = torch.where(n < keys, rt * q.stride(1) + rh * q.stride(2) + rw * q.stride(3), 0)
        enc[n, rt] = 1
        enc[n, st + rh] = 1
        enc[n, st + sh + rw] = 1
    out = torch.empty_like(q)
    grid = (-(-t // qt) * -(-h // qh) * -(-w // qw), b * heads)
    na3d_var[grid](q, k, v, out, enc, offs, t, h, w, heads, lt, lh, lw, *q.stride()[:5], *out.stride()[:5],
                   kt, kh, kw, qt, qh, qw, st, sh, sw, ltm, width, dim, block_n, mask, num_warps=warps, num_stages=stages)
    return out


VARIANTS = ("2:4x4x8/64/4/3,3:4x4x8/64/4/3,4:4x4x8/64/4/3,5:4x4x8/64/4/3,5:4x4x8/64/8/3,5:4x4x4/64/4/3,"
            "5:2x8x8/64/4/3,5:4x4x8/64/4/4,5:4x4x8/32/4/3,5:4x4x8/128/8/3,5:4x8x4/64/4/3,5:8x4x4/64/4/3,"
            "5:4x4x8/64/4/2,5:2x4x8/64/4/3,5:4x4x4/32/4/3")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--shape", default="121x128x192x4")
    parser.add_argument("--kernel", default="11x11x11")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    t, h, w, heads = (int(x) for x in args.shape.split("x"))
    kernel = tuple(int(x) for x in args.kernel.split("x"))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(dev).manual_seed(0)
    shape = (1, t, h, w, heads, 64)
    q, k, v = (torch.randn(shape, generator=g, device=dev) for _ in range(3))
    q = torch.nn.functional.rms_norm(q, (64,)) / 8
    k = torch.nn.functional.rms_norm(k, (64,))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    shipped = lambda: na_triton.na3d_triton(q, k, v, kernel)  # noqa: E731
    reference = shipped()
    useful = 4 * t * h * w * math.prod(kernel) * 64 * heads / 1e12
    cases = [("na_triton as shipped", shipped)]
    for text in args.variants.split(","):
        mask, rest = text.split(":")
        tile, bn, warps, stages = rest.split("/")
        cases.append((text, lambda m=int(mask), tl_=tuple(int(x) for x in tile.split("x")), bn=int(bn),
                      wa=int(warps), st=int(stages): run(q, k, v, kernel, tl_, bn, wa, st, m)))
    for name, fn in cases:
        row = {"case": name}
        try:
            ms = timed(fn, args.repeats) if dev.type == "cuda" else float("nan")
            diff = (fn().float() - reference.float()).abs().max().item()
            row.update(ms=round(ms, 2), useful_tflops=round(useful / (ms / 1e3), 1), max_abs_diff=diff)
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(f"[var] {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()
