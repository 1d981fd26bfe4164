"""How far the fastest bf16 DiT step is from what its own kernels allow (issue 24's step goals: stage 1 ≤ 0.08 s,
stage 2 ≤ 0.30 s at 768×512×121).

For each stage, in one process on the released config with random bf16 weights:
- the step in `compile_cuda_graph` (the fastest bf16 mode) and in `compile` (the same Inductor kernels launched
  one by one, which torch.profiler can see), medians;
- the step's FLOPs (FlopCounterMode on an eager step) by operator;
- the `compile` step under torch.profiler: CUDA time of the GEMMs per (M, K, N), of attention per shape, and of the
  rest (Inductor's fused element-wise kernels, copies);
- every GEMM shape and attention shape seen, timed alone (cuBLAS / SDPA with the mode's cuDNN kernel, warm, medians):
  what each costs outside the step, and those + the rest as compiled (`floor_s`; not a floor where small GEMMs,
  launch-bound alone even back to back, run faster inside the step).

    python bench/diag_step_roofline.py --out $OUT/roofline.json      # CUDA, 22B config, real shapes
    python bench/diag_step_roofline.py --smoke --out /tmp/r.json     # CPU, tiny config (the script itself)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from nodes.ltx.dit import transformer as T  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import drop_graphs, make_denoiser  # noqa: E402

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def timed(fn, device: torch.device, runs: int = 9, warmup: int = 3, back_to_back: int = 10) -> float:
    """Median seconds of one `fn`, timed over `back_to_back` launches in a row as in a step (CUDA events on a GPU):
    one launch alone would time the launch of a small GEMM, not the GEMM."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        return bt.median_seconds(fn, device, runs, 0)
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(back_to_back):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / back_to_back)
    return statistics.median(times)


def gemm_mkn(key: str, shapes: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a GEMM event's input shapes."""
    if key in ("aten::mm",) and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return 1, m, k, n
    if key == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        return 1, m, k, n
    if key in ("aten::bmm", "aten::baddbmm"):
        a, b = (shapes[0], shapes[1]) if key == "aten::bmm" else (shapes[1], shapes[2])
        if len(a) == 3 and len(b) == 3:
            return a[0], a[1], a[2], b[2]
    return None


def profile_step(denoise, video, audio, device: torch.device) -> dict:
    """CUDA time of one step by GEMM shape, attention shape and the rest."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        denoise(video, audio, 0.725)
        bt.sync(device)
    gemms, attention = collections.Counter(), collections.Counter()
    gemm_calls, attention_calls = collections.Counter(), collections.Counter()
    for event in prof.key_averages(group_by_input_shape=True):
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        if event.key in GEMMS:
            mkn = gemm_mkn(event.key, event.input_shapes)
            if mkn is not None:
                gemms[mkn] += us
                gemm_calls[mkn] += event.count
        elif event.key.startswith("aten::_scaled_dot_product") and event.key.endswith("attention"):
            q, k = event.input_shapes[0], event.input_shapes[1]
            shape = (tuple(q), tuple(k))
            attention[shape] += us
            attention_calls[shape] += event.count
    per_kernel = {e.key: ((e.self_device_time_total if hasattr(e, "self_device_time_total")
                           else e.self_cuda_time_total), e.count)
                  for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
                  and not e.key.startswith("## ")}  # "## Call CompiledFxGraph …": an annotation, not a kernel
    top = sorted(per_kernel.items(), key=lambda item: -item[1][0])[:30]
    return {"gemm_us": gemms, "gemm_calls": gemm_calls, "attention_us": attention,
            "attention_calls": attention_calls, "kernels_us": sum(us for us, _ in per_kernel.values()),
            "top_kernels": [{"kernel": k[:120], "ms": round(us / 1e3, 3), "calls": n} for k, (us, n) in top]}


def best_gemm_s(batch: int, m: int, k: int, n: int, device, dtype) -> float:
    """A GEMM alone, its second operand laid out as a Linear's weight (N × K, transposed)."""
    a = torch.randn(batch, m, k, device=device, dtype=dtype).squeeze(0)
    b = torch.randn(batch, n, k, device=device, dtype=dtype).squeeze(0).transpose(-1, -2)
    return timed(lambda: torch.matmul(a, b), device)


def best_attention_s(q_shape, k_shape, device, dtype) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(q_shape, device=device, dtype=dtype)
    k = torch.randn(k_shape, device=device, dtype=dtype)
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION] if device.type == "cuda" else [SDPBackend.MATH]
    with sdpa_kernel(backends, set_priority=True):
        return timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, k), device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, dtype, config, shapes = bt.stage_setup(args.smoke)
    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, shapes, device, dtype)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "shapes": {s: [list(v), list(a)] for s, (v, a) in shapes.items()}, "stages": {}}
    fast_mode = "compile_cuda_graph" if device.type == "cuda" else "compile"
    with torch.inference_mode():
        from torch.utils.flop_counter import FlopCounterMode
        for stage, (video, audio) in inputs.items():
            # Counted before anything is compiled: compiled blocks called once under the counter's dispatch mode
            # ran eagerly in every later call (stage 2 0.44 s instead of 0.36, measured on the H200).
            with FlopCounterMode(display=False) as counter:
                T.denoise(model, video, audio, 0.725, cond, bt.FPS)
            by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
            result["stages"][stage] = {
                "tflop_per_step": round(counter.get_total_flops() / 1e12, 3),
                "tflop_by_op": {op: round(n / 1e12, 3) for op, n in sorted(by_op.items(), key=lambda x: -x[1])}}
        for stage, (video, audio) in inputs.items():
            entry = result["stages"][stage]
            for mode in (fast_mode, "compile"):
                denoise = make_denoiser(model, cond, bt.FPS, mode)
                entry[f"{mode}_step_s"] = round(bt.median_seconds(lambda: denoise(video, audio, 0.725), device,
                                                                  args.runs, 2), 4)
                if mode == "compile_cuda_graph":
                    drop_graphs(model)
            profile_step(denoise, video, audio, device)  # the second profile is the one read: nothing lazy left
            profiled = profile_step(denoise, video, audio, device)
            gemm_rows, gemm_in_step, gemm_best = [], 0.0, 0.0
            for mkn, us in profiled["gemm_us"].most_common():
                calls = profiled["gemm_calls"][mkn] or 1
                best = best_gemm_s(*mkn, device, dtype)
                batch, m, k, n = mkn
                flop = 2 * batch * m * k * n
                gemm_in_step += us / 1e6
                gemm_best += best * calls
                gemm_rows.append({"batch_m_k_n": list(mkn), "calls": calls, "in_step_ms": round(us / 1e3, 3),
                                  "in_step_tflops": round(flop * calls / (us / 1e6) / 1e12, 1) if us else None,
                                  "alone_ms_each": round(best * 1e3, 4),
                                  "alone_tflops": round(flop / best / 1e12, 1)})
            attention_rows, attention_in_step, attention_best = [], 0.0, 0.0
            for (q, k), us in profiled["attention_us"].most_common():
                calls = profiled["attention_calls"][(q, k)] or 1
                best = best_attention_s(q, k, device, dtype)
                flop = 4 * q[0] * q[1] * q[2] * k[2] * q[3]
                attention_in_step += us / 1e6
                attention_best += best * calls
                attention_rows.append({"q": list(q), "k": list(k), "calls": calls, "in_step_ms": round(us / 1e3, 3),
                                       "in_step_tflops": round(flop * calls / (us / 1e6) / 1e12, 1) if us else None,
                                       "alone_ms_each": round(best * 1e3, 4),
                                       "alone_tflops": round(flop / best / 1e12, 1)})
            kernels = profiled["kernels_us"] / 1e6
            rest = kernels - gemm_in_step - attention_in_step
            entry.update({
                "profiled_kernels_s": round(kernels, 4), "gemm_in_step_s": round(gemm_in_step, 4),
                "gemm_alone_s": round(gemm_best, 4), "attention_in_step_s": round(attention_in_step, 4),
                "attention_alone_s": round(attention_best, 4), "rest_in_step_s": round(rest, 4),
                "floor_s": round(gemm_best + attention_best + rest, 4),
                "gemm_and_attention_alone_s": round(gemm_best + attention_best, 4),
                "gemms": gemm_rows, "attention": attention_rows, "top_kernels": profiled["top_kernels"]})
            print(json.dumps({stage: {k: v for k, v in entry.items() if k not in ("gemms", "attention",
                                                                                  "top_kernels")}}),
                  flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"[diag] {time.perf_counter() - started:.1f} s", flush=True)
    raise SystemExit(code)
