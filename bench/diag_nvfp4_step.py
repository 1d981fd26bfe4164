"""Where an NVFP4 DiT step spends its time against bf16 (issue 19): the A/B graph on a 24 GiB card ran stage 2 at
0.72 s a step against bf16's 0.37, far more than the per-Linear decode figures of bench/bench_nvfp4_linear.py add up
to. Real shapes, random weights, one GPU, one process.

    python bench/diag_nvfp4_step.py --out $OUT/diag_nvfp4.json    # CUDA (about 4 minutes on an H200)
    python bench/diag_nvfp4_step.py --smoke --out /tmp/diag.json  # CPU, tiny config (checks the script)

Per stage (768×512×121's two token counts), the median step time of: bf16 under compile_cuda_graph; then the same
model with its blocks' Linears made NVFP4 (bench_ab_graph.quantize_blocks) eager, compiled and compile_cuda_graph,
and compile_cuda_graph again with a filler leaving `--card-gib` usable (the graph's card). For one stage-2 step of
bf16 and of NVFP4 (compiled, no CUDA graph, so the profiler sees each kernel) the CUDA kernels that take the most
time. Writes JSON to --out as it goes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from bench_ab_graph import quantize_blocks  # noqa: E402
from bench_fp8_compute import FPS, reset_compiled  # noqa: E402
from nodes.ltx.dit import accelerated_denoise as A  # noqa: E402

GIB = 2**30


def top_kernels(denoise, video, audio, device: torch.device, count: int = 15) -> list:
    """[(kernel name, calls, total ms)] of one step, most time first."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.inference_mode(), torch.profiler.profile(activities=activities) as prof:
        denoise(video, audio, 0.725)
        bt.sync(device)
    attr = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0 and (device.type != "cuda" or e.device_type ==
                                                                           torch.autograd.DeviceType.CUDA)]
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    return [(e.key[:120], e.count, round(getattr(e, attr) / 1e3, 3)) for e in events[:count]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--card-gib", type=float, default=24.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    device, dtype, config, shapes = bt.stage_setup(args.smoke)
    result: dict = {"bench": "diag_nvfp4_step", "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                    else "cpu", "torch": torch.__version__, "steps_s": {}, "top_kernels": {}, "errors": {}}

    def write() -> None:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)

    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, shapes, device, dtype)

    def steps(name: str, mode: str) -> None:
        reset_compiled(model)
        for stage, (video, audio) in inputs.items():
            denoise = A.make_denoiser(model, cond, FPS, mode)
            with torch.inference_mode():
                seconds = bt.median_seconds(lambda: denoise(video, audio, 0.725), device, args.runs, warmup=2)
            result["steps_s"][f"{name} {mode} {stage}"] = round(seconds, 4)
            print(f"[diag] {name} {mode} {stage}: {seconds:.4f} s", file=sys.stderr, flush=True)
            write()

    def profile(name: str) -> None:
        reset_compiled(model)
        video, audio = inputs["stage2"]
        denoise = A.make_denoiser(model, cond, FPS, "eager" if args.smoke else "compile")
        with torch.inference_mode():
            denoise(video, audio, 0.725)  # compiles
        result["top_kernels"][name] = top_kernels(denoise, video, audio, device)
        write()

    try:
        steps("bf16", "compile_cuda_graph" if not args.smoke else "compile")
        profile("bf16 stage2")
        result["nvfp4_layers"] = quantize_blocks(model, "nvfp4") if not args.smoke else 0
        for mode in (("eager", "compile", "compile_cuda_graph") if not args.smoke else ("eager",)):
            steps("nvfp4", mode)
        profile("nvfp4 stage2")
        if device.type == "cuda":
            reset_compiled(model)
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(device)[0]
            total = torch.cuda.get_device_properties(device).total_memory
            filler = torch.empty(max(0, min(free - GIB, int(total - args.card_gib * GIB))), dtype=torch.uint8,
                                 device=device)
            result["filler_gib"] = filler.numel() / GIB
            steps(f"nvfp4 card {args.card_gib:g} GiB", "compile_cuda_graph")
            del filler
    except Exception as error:
        traceback.print_exc()
        result["errors"]["run"] = f"{type(error).__name__}: {error}"
    write()
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
