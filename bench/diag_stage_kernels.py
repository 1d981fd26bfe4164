"""Where a DiT step spends its time at a given size (the 1280×704×121 graph against ComfyUI core, issue 24): the
step in eager and `cuda_graph` modes with PyTorch's default SDPA choice and with the SDPA kernels ComfyUI core prefers
(`--sdpa` lists them, in priority order), the self-attention call alone per SDPA kernel, and one eager step under
torch.profiler with its CUDA time summed per kernel family.

    python bench/diag_stage_kernels.py --size 1280x704x121 --out $OUT/diag.json   # CUDA, 22B config, random bf16
    python bench/diag_stage_kernels.py --smoke --out /tmp/diag.json                # CPU, tiny config (the script)
    python bench/diag_stage_kernels.py --after-core-attention --out $OUT/order.json  # the order ComfyUI leaves

`--after-core-attention`: the process's first attention runs as ComfyUI core's does (comfy/ops.py: FlashAttention
first, `set_priority=True`), then stage 2's `cuda_graph` step with the pack's preferred kernel entered around it
(`accelerated_denoise.preferred_attention`) and without (the process's order, as before), and SDPA's order
before and after each.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from nodes.ltx.dit import transformer as T  # noqa: E402
from nodes.ltx.dit import accelerated_denoise as A  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import make_denoiser  # noqa: E402

FAMILIES = (("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")), ("gemm", ("gemm", "sm90", "cutlass",
            "cublas", "nvjet", "matmul")), ("norm", ("norm",)))


def family(kernel: str) -> str:
    lowered = kernel.lower()
    return next((name for name, keys in FAMILIES if any(k in lowered for k in keys)), "elementwise/other")


def sdpa_context(names: list[str]):
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, n) for n in names], set_priority=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1280x704x121")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--sdpa", default="FLASH_ATTENTION,CUDNN_ATTENTION,EFFICIENT_ATTENTION,MATH",
                        help="core's priority (comfy/ops.py)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--after-core-attention", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.after_core_attention:
        return after_core_attention(args)
    device, dtype, config, shapes = bt.stage_setup(args.smoke)
    if not args.smoke:
        w, h, f = (int(x) for x in args.size.split("x"))
        latent_f = (f - 1) // 8 + 1
        audio_t = round(f / bt.FPS * 25) + 1
        shapes = {"stage2": ((1, 128, latent_f, h // 32, w // 32), (1, 8, audio_t, 16)),
                  "stage1": ((1, 128, latent_f, h // 64, w // 64), (1, 8, audio_t, 16))}
    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, shapes, device, dtype)
    core = args.sdpa.split(",")
    # The denoisers enter torch's preferred kernel themselves; off here, so that each row runs the order it names.
    A.preferred_attention = lambda device: None
    result = {"size": args.size, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "sdpa_core": core, "stages": {}}
    modes = ["eager"] + (["cuda_graph"] if device.type == "cuda" else [])
    for stage, (video, audio) in inputs.items():
        entry = result["stages"][stage] = {"video": list(video.shape), "audio": list(audio.shape)}
        with torch.inference_mode():
            for mode in modes:
                for label, names in (("default", []), ("core_priority", core), ("cudnn_first", ["CUDNN_ATTENTION"] + [
                        n for n in core if n != "CUDNN_ATTENTION"])):
                    with sdpa_context(names):  # a graph is captured inside the context: its kernels are kept
                        denoise = make_denoiser(model, cond, bt.FPS, mode)
                        entry[f"{mode}_{label}_s"] = round(bt.median_seconds(
                            lambda: denoise(video, audio, 0.725), device, args.runs, 2), 4)
                    if mode == "cuda_graph":
                        from nodes.ltx.dit.accelerated_denoise import drop_graphs
                        drop_graphs(model)
            # the video self-attention alone: [B, heads, N, head_dim]
            tokens = video.shape[2] * video.shape[3] * video.shape[4]
            q = torch.randn(1, config.heads, tokens, config.head_dim, device=device, dtype=dtype)
            flops = 4 * tokens * tokens * config.heads * config.head_dim
            for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
                try:
                    with sdpa_context([name]):
                        s = bt.median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q),
                                              device, args.runs, 2)
                    entry[f"self_attention_{name}_ms"] = round(s * 1e3, 3)
                    entry[f"self_attention_{name}_tflops"] = round(flops / s / 1e12, 1)
                except RuntimeError as error:
                    entry[f"self_attention_{name}_ms"] = f"{type(error).__name__}: {str(error)[:120]}"
            if device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile
                for label, names in (("default", []), ("core_priority", core)):
                    with sdpa_context(names), profile(activities=[ProfilerActivity.CUDA]) as prof:
                        T.denoise(model, video, audio, 0.725, cond, bt.FPS)
                        torch.cuda.synchronize()
                    per_family, per_kernel = collections.Counter(), collections.Counter()
                    for event in prof.key_averages():
                        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
                        if us and event.key and not event.key.startswith("ProfilerStep"):
                            per_family[family(event.key)] += us
                            per_kernel[event.key[:90]] += us
                    entry[f"profile_{label}_ms"] = {k: round(v / 1e3, 2) for k, v in per_family.most_common()}
                    entry[f"top_kernels_{label}_ms"] = {k: round(v / 1e3, 2) for k, v in per_kernel.most_common(14)}
        print(json.dumps({stage: entry}), flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


def after_core_attention(args) -> int:
    device, dtype, config, shapes = bt.stage_setup(args.smoke)
    order = lambda: [torch.nn.attention.SDPBackend(b).name for b in torch._C._get_sdp_priority_order()]  # noqa: E731
    result = {"size": args.size, "order_at_start": order()}
    small = torch.randn(1, 8, 128, 64, device=device, dtype=dtype)
    with sdpa_context(args.sdpa.split(",")):
        torch.nn.functional.scaled_dot_product_attention(small, small, small)
    result["order_after_core_attention"] = order()
    if not args.smoke:
        w, h, f = (int(x) for x in args.size.split("x"))
        shapes = {"stage2": ((1, 128, (f - 1) // 8 + 1, h // 32, w // 32), (1, 8, round(f / bt.FPS * 25) + 1, 16))}
    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, {"stage2": shapes["stage2"]}, device, dtype)
    video, audio = inputs["stage2"]
    mode = "cuda_graph" if device.type == "cuda" else "eager"
    result["preferred_attention"] = A.preferred_attention(device)
    preferred = A.preferred_attention
    with torch.inference_mode():
        for label, choice in (("with_preferred_kernel", preferred), ("process_order", lambda device: None)):
            A.preferred_attention = choice
            denoise = A.make_denoiser(model, cond, bt.FPS, mode)
            result[f"{mode}_{label}_s"] = round(bt.median_seconds(lambda: denoise(video, audio, 0.725), device,
                                                                  args.runs, 2), 4)
            result[f"order_after_{label}"] = order()
            A.drop_graphs(model)
    A.preferred_attention = preferred
    print(json.dumps(result), flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"[diag] {time.perf_counter() - started:.1f} s", flush=True)
    raise SystemExit(code)
