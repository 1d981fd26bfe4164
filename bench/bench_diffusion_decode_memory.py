"""Diffusion-VAE decode memory (issues #19 item 4 and #24): peak device memory and time of our decode, untiled and
under tight budgets, next to what the planner predicted, on the released decoder config (417 M parameters) with
random bf16 weights built on the GPU (`bench_diffusion_vae.build`).

    python bench/bench_diffusion_decode_memory.py --out OUT.json           # CUDA, < 4 minutes on an H200
    python bench/bench_diffusion_decode_memory.py --smoke --out OUT.json   # CPU, the tiny config (the script runs)

Cases, in this order (the goals they answer in brackets):
- untiled 768×512×121 (median of --repeats after a warm-up) and 1920×1088×121 (one run after a warm-up)
  [#24: peak ≤ 10.4 / 49 GiB, time ≤ 0.25× ComfyUI core's 3.06 / 16.2 s];
- 1920×1088×121 and ×241 under a 4 GiB budget, the weights included (`memory_budget_gb=4`)
  [#19: completes, peak ≤ 4 GiB, 241-frame peak ≤ 1.1× the 121-frame one];
- 1920×1088×121 and ×241 at the smallest budget the planner accepts (`diffusion_tiling.smallest_schedule`).
Per case: seconds, `torch.cuda.max_memory_allocated` and `max_memory_reserved` (absolute: the weights are in
them), the planner's estimate plus the weights (its prediction of the allocated peak), the schedule (grid, tile
pixels, stages-1-3 slab size), and for tiled 121-frame cases the largest and mean |Δ| of the frames against the
untiled decode (seams would show there). A case still running at --deadline-s is stopped between tiles (its peak
so far is recorded, `completed: false`): every temporal group of a tiled decode is alike, so the peak is reached in
the first. The JSON is rewritten after every case.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_diffusion_vae import RELEASED_METADATA, TINY_METADATA, build  # noqa: E402

from nodes.ltx.decode import diffusion_tiling as dt  # noqa: E402
from nodes.ltx.decode import diffusion_vae as dv  # noqa: E402
from nodes.ltx.device_memory import weight_bytes  # noqa: E402
from nodes.ltx.kernels import na_attention as na  # noqa: E402

GiB = 2**30
UNTILED = {"768x512x121": (16, 16, 24), "1920x1088x121": (16, 34, 60)}
LONG = {"1920x1088x121": (16, 34, 60), "1920x1088x241": (31, 34, 60)}
SMOKE_UNTILED = {"96x96x17": (3, 3, 3), "128x96x25": (4, 3, 4)}
SMOKE_LONG = {"96x96x25": (4, 3, 3), "96x96x49": (7, 3, 3)}
CORE = {"768x512x121": (10.4, 3.06), "1920x1088x121": (49.0, 16.2)}  # ComfyUI 0.33: peak GiB, seconds (#24)


class Deadline(Exception):
    """Raised from the progress callback when the bench's time is up."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny config on the CPU")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the untiled 768×512×121 decode")
    parser.add_argument("--budget-gib", type=float, default=4.0, help="the tight budget, weights included")
    parser.add_argument("--deadline-s", type=float, default=200.0, help="stop starting or running cases after this")
    parser.add_argument("--processor", default="auto")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_diffusion_decode_memory.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    vae = build(TINY_METADATA if args.smoke else RELEASED_METADATA, device, dtype)
    processor = na.make_processor("sdpa" if args.smoke else args.processor, device)
    weights = weight_bytes(vae)
    frames_on_device = device.type == "cpu"  # the frames go to host memory: the decode's own device on the CPU
    memory = dv.memory_model(vae, 1, processor, frames_on_device)
    untiled, long = (SMOKE_UNTILED, SMOKE_LONG) if args.smoke else (UNTILED, LONG)
    results: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "commit": _commit(), "dtype": str(dtype), "processor": processor.name, "weights_bytes": weights,
        "budget_gib": args.budget_gib, "cases": {}, "goals": {}}
    frames_untiled: dict = {}

    def save() -> None:
        if args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1, default=str)

    def run(name: str, latent_thw: tuple[int, int, int], repeats: int = 1, warm: bool = False,
            memory_budget_gb: float = 0.0, free_memory: int | None = None, untiled_case: bool = False) -> None:
        if time.perf_counter() - start > args.deadline_s:
            results["cases"][name] = {"skipped": "deadline"}
            save()
            return
        mode = "off" if untiled_case else "auto"
        # the decoder's own defaults: the smallest overlaps its reach allows (40 frames / 160 px)
        request = dataclasses.replace(dv.default_request(vae, mode), memory_budget_gb=memory_budget_gb)
        latent = torch.randn(1, 128, *latent_thw, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        budget = request.budget_bytes(weights, free_memory if free_memory is not None else 0, name) \
            if memory_budget_gb or free_memory is not None else None
        schedule = dv.plan(vae, latent_thw, request, budget, 1, processor, frames_on_device)
        estimate = memory.estimate(schedule)
        row = {"latent": latent_thw, "grid": schedule.grid, "tile_pixels": _tile(schedule),
               "pre_chunk": schedule.pre_chunk, "budget_bytes": budget, "estimate_bytes": estimate,
               "predicted_peak_bytes": estimate + weights}
        done = {"tiles": 0}

        def on_step(tiles: int, total: int) -> None:
            done["tiles"], done["total"] = tiles, total
            if time.perf_counter() - start > args.deadline_s:
                raise Deadline

        times, frames = [], None
        try:
            for i in range(repeats + int(warm)):
                _reset(device)
                began = time.perf_counter()
                frames, stats = dv.decode(vae, latent, processor=processor, request=request, seed=0,
                                          free_memory=free_memory if free_memory is not None else None,
                                          on_step=on_step, out_device="cpu")
                _sync(device)
                if i >= int(warm):
                    times.append(time.perf_counter() - began)
            row.update(completed=True, seconds=statistics.median(times), runs=len(times),
                       stats_grid=stats.extra["grid"])
        except Deadline:
            row.update(completed=False, tiles_done=done["tiles"], tiles_total=done.get("total"))
            frames = None
        row.update(_peaks(device))
        if row.get("peak_allocated_bytes"):
            row["measured_over_predicted"] = row["peak_allocated_bytes"] / row["predicted_peak_bytes"]
        if frames is not None and untiled_case:
            frames_untiled[latent_thw] = frames
        elif frames is not None and latent_thw in frames_untiled:
            diff = (frames - frames_untiled[latent_thw]).abs()
            row.update(max_abs_diff_vs_untiled=float(diff.max()), mean_abs_diff_vs_untiled=float(diff.mean()))
        results["cases"][name] = row
        print(f"[bench] {name}: {json.dumps(row, default=str)}", file=sys.stderr, flush=True)
        save()

    first = next(iter(untiled))
    for label, shape in untiled.items():
        run(f"untiled_{label}", shape, args.repeats if label == first else 1, warm=True, untiled_case=True)
    for label, shape in long.items():
        run(f"budget_{args.budget_gib:g}gib_{label}", shape, memory_budget_gb=args.budget_gib)
    for label, shape in long.items():
        floor = memory.estimate(dt.smallest_schedule(vae.config.geometry(), shape, memory))
        run(f"floor_{label}", shape, free_memory=floor)
        results["cases"][f"floor_{label}"]["floor_budget_bytes"] = floor
    frames_untiled.clear()
    _goals(results, args.budget_gib, list(long), list(untiled))
    results["total_seconds"] = time.perf_counter() - start
    save()
    print(json.dumps(results, default=str))
    return 0


def _goals(results: dict, budget_gib: float, long: list[str], untiled: list[str]) -> None:
    """The issues' goals against this run's figures (None where a case did not complete)."""
    cases, goals = results["cases"], results["goals"]
    for label in untiled:
        row = cases.get(f"untiled_{label}", {})
        if label in CORE and "peak_allocated_bytes" in row and row.get("completed"):
            peak_gib, seconds = CORE[label]
            goals[f"untiled_{label}"] = {"peak_gib": row["peak_allocated_bytes"] / GiB, "goal_peak_gib": peak_gib,
                                         "seconds": row["seconds"], "goal_seconds": 0.25 * seconds,
                                         "met": row["peak_allocated_bytes"] <= peak_gib * GiB
                                         and row["seconds"] <= 0.25 * seconds}
    for prefix in (f"budget_{budget_gib:g}gib", "floor"):
        rows = [cases.get(f"{prefix}_{label}", {}) for label in long]
        if all(r.get("completed") and "peak_allocated_bytes" in r for r in rows):
            short, longer = (r["peak_allocated_bytes"] for r in rows)
            goals[prefix] = {"peaks_gib": [short / GiB, longer / GiB], "ratio_long_over_short": longer / short,
                             "met_ratio": longer <= 1.1 * short}
            if prefix.startswith("budget"):
                goals[prefix]["met_budget"] = max(short, longer) <= budget_gib * GiB


def _tile(schedule: dt.TileSchedule) -> tuple[int, ...]:
    return tuple(max(s.length for s in axis) for axis in schedule.spans)


def _reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peaks(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
