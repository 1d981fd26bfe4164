"""NVFP4 Linears on the GPU: the weight decoded by torch ops (`files.quant.dequantize_nvfp4`) or by the one-pass
Triton kernel (`kernels/nvfp4_triton.py`), each followed by the bf16 GEMM, against a plain bf16 Linear — at the DiT's
Linear shapes and the tokens of the two stages (768×512×121), eager and inside torch.compile (as compile_cuda_graph
runs the blocks), plus whether the kernel's bf16 weight equals the torch decode's bit for bit.

    python bench/bench_nvfp4_linear.py --out nvfp4.json           # CUDA
    python bench/bench_nvfp4_linear.py --smoke --out nvfp4.json   # CPU (torch path only; checks the script)

Decode bytes per weight: torch ops ≈ 0.5 (packed) + 4 (int32 index) + 8 (float32 pair) ×2 + 2 (bf16) by their
kernels' reads and writes; the kernel 0.5 + 0.0625 (the E4M3 block scale per 16) + 2, one launch. Writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_transformer import median_seconds  # noqa: E402
from nodes.ltx.files import quant  # noqa: E402
from nodes.ltx.kernels import nvfp4_triton  # noqa: E402

# (in, out) of the DiT block's Linears: attention q/k/v/out 4096², feed-forward 4096→16384→4096, audio 2048
SHAPES = {"attn 4096x4096": (4096, 4096), "ff up 4096x16384": (4096, 16384), "ff down 16384x4096": (16384, 4096),
          "audio attn 2048x2048": (2048, 2048)}
TOKENS = {"stage1": 1536, "stage2": 6144}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    shapes = {"tiny 64x128": (64, 128)} if args.smoke else SHAPES
    tokens = {"tiny": 16} if args.smoke else TOKENS
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cases": {}}
    g = torch.Generator(device).manual_seed(0)
    for name, (k, n) in shapes.items():
        stored = {key: t.to(device) for key, t in quant.quantize_nvfp4(
            torch.randn(n, k, generator=g, device=device).cpu() / k**0.5).items()}
        packed, block, tensor = stored["weight"], stored["weight_scale"], stored["weight_scale_2"]
        dense = quant.dequantize_nvfp4(packed, block, tensor, torch.bfloat16)

        def torch_ops(x):
            return torch.nn.functional.linear(x, quant.dequantize_nvfp4(packed, block, tensor, x.dtype))

        def one_pass(x):
            return torch.nn.functional.linear(x, nvfp4_triton.dequantize(packed, block, tensor, x.dtype))

        def plain(x):
            return torch.nn.functional.linear(x, dense)

        variants = {"bf16": plain, "torch_ops": torch_ops}
        row = {}
        if nvfp4_triton.available(device):
            variants["one_pass"] = one_pass
            row["one_pass_weight_bit_identical"] = bool(torch.equal(
                nvfp4_triton.dequantize(packed, block, tensor).view(torch.int16), dense.view(torch.int16)))
            with torch.inference_mode():  # the decode alone, and its traffic against the card's bandwidth
                seconds = median_seconds(lambda: nvfp4_triton.dequantize(packed, block, tensor), device, args.runs, 3)
            row["one_pass_decode_only"] = {"ms": seconds * 1e3,
                                           "GB_per_s": n * k * (0.5 + 1 / 16 + 2) / seconds / 1e9}
            variants["torch_ops_compiled"] = torch.compile(torch_ops)
            variants["one_pass_compiled"] = torch.compile(one_pass)
        for stage, m in tokens.items():
            x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
            want = plain(x)
            for variant, fn in variants.items():
                with torch.inference_mode():
                    got = fn(x)
                    seconds = median_seconds(lambda: fn(x), device, args.runs, 3)
                row[f"{stage} {variant}"] = {"ms": seconds * 1e3, "equal_to_bf16": bool(torch.equal(got, want))}
        result["cases"][name] = row
        print(name, json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
