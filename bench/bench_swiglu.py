"""Stage 5's SwiGLU hidden layer on one token tile: `fused_block.swiglu_hidden` (one Triton GEMM, silu·up in its
epilogue) in several launch shapes, against two cuBLAS projections alone and with silu·up as torch ops, on the same
random bf16 inputs. Per case: median ms of --repeats calls after a warm-up, TFLOP/s, max abs difference from the
torch path.

    python bench/bench_swiglu.py                      # CUDA, 65536 tokens × 256 → 1024
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_na_kernel import timed  # noqa: E402

from nodes.ltx.kernels import fused_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=fused_block.SWIGLU_TOKENS)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--configs", default="128x128x64/8/3,128x128x64/4/3,128x64x64/4/3,64x128x64/4/3,"
                                             "128x256x64/8/3,128x128x64/8/4,256x128x64/8/3,128x128x128/8/2")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(args.tokens, args.channels, generator=g, device="cuda").bfloat16()
    gate, up = (torch.randn(args.hidden, args.channels, generator=g, device="cuda").bfloat16() / 16 for _ in range(2))
    flop = 2 * 2 * args.tokens * args.channels * args.hidden / 1e12
    reference = F.silu(F.linear(x, gate)) * F.linear(x, up)
    cases = [("cublas projections only", lambda: (F.linear(x, gate), F.linear(x, up))),
             ("cublas + torch silu·up", lambda: F.silu(F.linear(x, gate)).mul_(F.linear(x, up)))]
    for text in args.configs.split(","):
        block, warps, stages = text.split("/")
        bm, bn, bk = (int(v) for v in block.split("x"))
        config = fused_block.GemmConfig(bm, bn, bk, int(warps), int(stages))
        cases.append((f"triton {text}", lambda c=config: fused_block.swiglu_hidden(x, gate, up, c)))
    for name, fn in cases:
        row = {"case": name, "tokens": args.tokens, "channels": args.channels, "hidden": args.hidden}
        try:
            ms = timed(fn, args.repeats)
            out = fn()
            row.update(ms=round(ms, 4), tflops=round(flop / (ms / 1e3), 1))
            if isinstance(out, torch.Tensor):
                row["max_abs_diff"] = (out.float() - reference.float()).abs().max().item()
        except Exception as error:  # noqa: BLE001 - a launch shape that does not compile is a result too
            row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        print(f"[swiglu] {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()
