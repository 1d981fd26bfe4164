"""Neighborhood attention alone, per diffusion-decoder stage at 768×512×121: blocked SDPA (`na3d_sdpa`),
comfy-kitchen's `na3d` (when installed) and our Triton kernel (`na_triton`) in several launch shapes, on the same
random bf16 q/k/v (RMS-normed and pre-scaled like the decoder's). Per case: median ms of --repeats calls after a
warm-up (which compiles), the useful TFLOP/s (4·tokens·window·D·heads — the work a perfect kernel does), and the
max abs difference from `na3d_sdpa`.

    python bench/bench_na_kernel.py                 # CUDA
    python bench/bench_na_kernel.py --stages 5 --configs 4x4x8/64/4/2,2x8x8/64/4/3
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nodes.ltx.kernels import na_attention as na
from nodes.ltx.kernels import na_triton

# (T, H, W), heads, kernel of each stage's attention at 768×512×121 (docs/MODEL.md §10.2; stage 5 on 4-pixel patches)
STAGES = {
    1: ((17, 16, 24), 32, (3, 7, 7)),
    2: ((17, 32, 48), 16, (3, 7, 7)),
    3: ((33, 32, 48), 8, (3, 5, 5)),
    4: ((65, 64, 96), 8, (3, 5, 5)),
    5: ((121, 128, 192), 4, (11, 11, 11)),
}
DEFAULT_CONFIGS = ("4x4x8/64/4/3,4x4x8/64/8/3,4x4x8/64/4/2,4x4x8/64/4/4,4x4x4/64/4/3,2x8x8/64/4/3,4x8x4/64/4/3,"
                   "4x4x8/32/4/3,4x4x8/128/8/3,2x4x8/64/4/3,4x4x4/64/8/3")


def parse_config(text: str) -> na_triton.KernelConfig:
    tile, block_n, warps, stages = text.split("/")
    return na_triton.KernelConfig(tuple(int(x) for x in tile.split("x")), int(block_n), int(warps), int(stages))


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default="1,2,3,4,5")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="tile/block_n/warps/stages, comma-separated")
    parser.add_argument("--small-configs", default="4x4x8/64/4/3,2x8x8/64/4/3,4x4x4/64/4/3,2x4x16/64/4/3",
                        help="configs tried on stages 1-4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_na_kernel.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    ck = na.ComfyKitchenNAProcessor() if {"cuda", "triton"} & set(na.comfy_kitchen_backends()) else None
    results = []
    for stage in (int(s) for s in args.stages.split(",")):
        dims, heads, kernel = STAGES[stage]
        shape = (1, *dims, heads, 64)
        g = torch.Generator(device).manual_seed(stage)
        q, k, v = (torch.randn(shape, generator=g, device=device) for _ in range(3))
        q = torch.nn.functional.rms_norm(q, (64,)) / 8
        k = torch.nn.functional.rms_norm(k, (64,))
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        useful = 4 * math.prod(dims) * math.prod(kernel) * 64 * heads / 1e12
        reference = na.na3d_sdpa(q, k, v, kernel)
        cases = [("sdpa", lambda: na.na3d_sdpa(q, k, v, kernel))]
        if ck is not None:
            cases.append(("comfy_kitchen", lambda: ck.na3d(q, k, v, kernel)))
        for text in (args.configs if stage == 5 else args.small_configs).split(","):
            config = parse_config(text)
            cases.append((f"triton {text}", lambda c=config: na_triton.na3d_triton(q, k, v, kernel, c)))
        for name, fn in cases:
            row = {"stage": stage, "case": name, "shape": list(shape), "kernel": list(kernel)}
            try:
                ms = timed(fn, args.repeats)
                diff = (fn().float() - reference.float()).abs().max().item()
                row.update(ms=round(ms, 3), useful_tflops=round(useful / (ms / 1e3), 1), max_abs_diff=diff)
            except Exception as error:  # noqa: BLE001 - a launch shape that does not compile is a result too
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            print(f"[na] {json.dumps(row)}", flush=True)
            results.append(row)
        del q, k, v, reference
        torch.cuda.empty_cache()
    with open(args.out, "w") as handle:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, handle,
                  indent=1)


if __name__ == "__main__":
    main()
