"""Diffusion-VAE decode: ours (nodes.ltx.decode.diffusion_vae.decode) per attention processor and tiling mode vs diffusers'
own `LTX2VideoDiffusionDecoderModel.decode` (its default flex processor, untiled and with its tiling) on the same
latent and weights: the released decoder config (417 M parameters) with random bf16 weights built on the GPU.

    python bench/bench_diffusion_vae.py            # CUDA: 768×512×121, 1920×1088×121 (+ 241 frames under 10 GiB)
    python bench/bench_diffusion_vae.py --smoke    # CPU, the tiny config at tiny shapes (checks the script runs)

Per shape and case: median seconds of --repeats runs after one warm-up (which also lets Triton autotune), peak
device memory (absolute, and above what was allocated before the call), the tile grid, the analytic FLOPs of the
work done (tiled decodes recompute their overlaps; stage 5 dominates, ≈ 100 TFLOP at 768×512×121) and the fraction
of --peak-tflops. Also: the planner's estimate next to the measured peak (calibration), our conv decode on the same
latent shape, and auto tiling under a 10 GiB budget (weights included) at 121 vs 241 frames. diffusers' own decode is
expected to run out of memory (its flex processor materializes the neighborhood mask); that is caught and recorded.
Prints one JSON line at the end; with --out, rewrites that JSON file after every case (partial results survive a
time limit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diffusers.models.autoencoders.ltx2_diffusion_decoder import (  # noqa: E402
    LTX2VideoDiffusionDecoderModel, LTX2VideoVaeNeighborhoodAttnProcessor)

from nodes.ltx.decode import diffusion_tiling as dt
from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.kernels import na_attention as na
from nodes.tools.tiny.diffusion_vae import TINY_DECODER

GiB = 2**30
OFF = TilingRequest("off")
RELEASED_METADATA = {"config": {"vae": {"_class_name": "CausalDiffusionVAE", "model_output_type": "x0", "decoder": {
    "in_channels": 128, "out_channels": 3, "patch_size": 4, "head_dim": 64,
    "stage_channels": [2048, 1024, 512, 512, 256], "stage_depths": [4, 6, 4, 2, 8],
    "stage_kernels": [[3, 7, 7], [3, 7, 7], [3, 5, 5], [3, 5, 5], [11, 11, 11]],
    "upsamples": [[[1, 2, 2], 2], [[2, 1, 1], 2], [[2, 2, 2], 1], [[2, 2, 2], 2]], "stage5_kernel": [11, 11, 11],
    "timestep_scale_multiplier": 1000.0, "default_num_inference_steps": 1, "resampler_kind": "linear",
    "spatial_padding_mode": "zeros"}}}}  # docs/MODEL.md §10.1
TINY_METADATA = {"config": {"vae": {"_class_name": "CausalDiffusionVAE", "model_output_type": "x0",
                                    "decoder": TINY_DECODER}}}
REAL_SHAPES = {"768x512x121": (16, 16, 24), "1920x1088x121": (16, 34, 60)}
LONG_SHAPES = {"1920x1088x121": (16, 34, 60), "1920x1088x241": (31, 34, 60)}
SMOKE_SHAPES = {"96x96x17": (3, 3, 3), "128x96x25": (4, 3, 4)}
SMOKE_LONG = {"96x96x17": (3, 3, 3), "96x96x33": (5, 3, 3)}


def build(metadata: dict, device: torch.device, dtype: torch.dtype) -> dv.DiffusionVAE:
    """Our container around a diffusers model built directly on `device` with its own random init."""
    config = dv.DiffusionVAEConfig.from_metadata("bench", metadata)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LTX2VideoDiffusionDecoderModel(**config.diffusers_kwargs())
            model.latents_mean.normal_(0, 0.1)
            model.latents_std.uniform_(0.75, 1.25)
    finally:
        torch.set_default_dtype(previous)
    return dv.DiffusionVAE(model.eval().requires_grad_(False), config)


# ------------------------------------------------------------------------------------------------ FLOPs
def _na_block(tokens: int, channels: int, kernel: tuple[int, ...], context: int = 0) -> int:
    hidden = (4 * channels + 15) // 16 * 16
    projections = 2 * tokens * channels * 4 * channels          # q, k, v, out
    attention = 4 * tokens * math.prod(kernel) * channels        # QKᵀ and PV over the window
    mlp = 2 * tokens * channels * hidden * 3
    return projections + attention + mlp + 2 * tokens * context * channels


def decode_flops(config: dv.DiffusionVAEConfig, schedule: dt.TileSchedule, steps: int) -> int:
    """Matmul FLOPs of the work a decode does: stages 1-3 once on the ghost-padded latent, stage 4 and `steps`
    stage-5 passes per tile (tiles recompute their overlaps)."""
    g, ch = schedule.geometry, config.stage_channels
    t, h, w = schedule.work_thw[0] + g.ghost_latent_frames, *schedule.work_thw[1:]
    total = 2 * t * h * w * config.in_channels * ch[0]
    grid = (t, h, w)
    for s in range(3):
        n = math.prod(grid)
        total += config.stage_depths[s] * _na_block(n, ch[s], config.stage_kernels[s])
        out = ch[s] * math.prod(config.upsample_strides[s]) // config.upsample_reductions[s]
        total += 2 * n * ch[s] * out
        st, sh, sw = config.upsample_strides[s]
        grid = (dt.upsample_frames(grid[0], st), grid[1] * sh, grid[2] * sw)
    px = config.patch_size
    for tile in schedule.tiles():
        n4 = (tile.feature_frames[1] - tile.feature_frames[0]) * (tile.h.cells[1] - tile.h.cells[0]) * \
            (tile.w.cells[1] - tile.w.cells[0])
        total += config.stage_depths[3] * _na_block(n4, ch[3], config.stage_kernels[3])
        total += 2 * n4 * ch[3] * ch[3] * math.prod(config.upsample_strides[3]) // config.upsample_reductions[3]
        n5 = tile.t.length * (tile.h.length // px) * (tile.w.length // px)
        per_step = config.stage_depths[4] * _na_block(n5, ch[4], config.stage5_kernel, ch[4])
        per_step += 2 * n5 * 3 * px * px * ch[4] * 2                # conv_in_x_t and conv_out
        total += steps * per_step
    return total


# ------------------------------------------------------------------------------------------------ timing
def measure(fn, device: torch.device, repeats: int) -> tuple[dict, object]:
    """(row, last result): median seconds of `repeats` calls after one warm-up and the peak memory, or
    `({"error": ...}, None)` when a call fails (diffusers' decode is expected to run out of memory)."""
    times, peak, peak_above, result = [], 0, 0, None
    try:
        for i in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                start_alloc = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            result = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                peak = max(peak, torch.cuda.max_memory_allocated(device))
                peak_above = max(peak_above, torch.cuda.max_memory_allocated(device) - start_alloc)
            if i:
                times.append(time.perf_counter() - start)
    except (torch.OutOfMemoryError, RuntimeError, ValueError) as error:
        traceback.clear_frames(error.__traceback__)  # free what the failed call held before the next case
        message = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        del error
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": message}, None
    return {"seconds": statistics.median(times), "runs": len(times), "peak_bytes": peak,
            "peak_above_start_bytes": peak_above}, result


def ours(vae, latent, device, repeats, flops_of, reference: dict | None = None, **kwargs) -> dict:
    """One of our decodes; with `reference`, the first one's frames are kept there and later ones compared to them
    (max and mean |Δ| of the [0, 1] frames: the processors' and fused passes' rounding differences)."""
    row, result = measure(lambda: dv.decode(vae, latent, **kwargs), device, repeats)
    if result is None:
        return row
    if reference is not None:
        frames = result[0].float()
        if "frames" not in reference:
            reference["frames"] = frames
        else:
            diff = (frames - reference["frames"]).abs()
            row.update(max_abs_diff_vs_first=float(diff.max()), mean_abs_diff_vs_first=float(diff.mean()))
    stats = result[1]
    processor = kwargs.get("processor", "auto")
    processor = processor if isinstance(processor, na.NeighborhoodAttnProcessor) else \
        na.make_processor(processor, latent.device)
    schedule = dv.plan(vae, tuple(latent.shape[2:]), kwargs.get("request") or dv.default_request(vae),
                       kwargs.get("free_memory"), latent.shape[0], processor)
    row.update(processor=stats.processor, grid=stats.extra["grid"], tiles=stats.tile_count, steps=stats.steps,
               tflop=flops_of(schedule, stats.steps) / 1e12,
               estimate_bytes=dv.memory_model(vae, latent.shape[0], processor).estimate(schedule))
    return row


def diffusers_decode(vae, latent, device, repeats, tiled: bool) -> dict:
    """diffusers' own decode: its default (flex) processor, its tiling defaults; denormalized input."""
    model = vae.model
    model.set_attn_processor(LTX2VideoVaeNeighborhoodAttnProcessor())
    z = latent * model.latents_std.view(1, -1, 1, 1, 1) + model.latents_mean.view(1, -1, 1, 1, 1)
    model.enable_tiling() if tiled else model.disable_tiling()

    def run():
        with torch.inference_mode():
            return model.decode(z, generator=torch.Generator(device).manual_seed(0), return_dict=False)[0]

    try:
        return measure(run, device, repeats)[0]
    finally:
        model.disable_tiling()
        na.install_processor(model, na.SdpaNAProcessor())


def conv_decode(shape: tuple[int, int, int], device, dtype, repeats) -> dict:
    """Our conv decode on the same latent shape (the other decoder of the A/B), auto tiling."""
    try:
        from bench_conv_vae import build as build_conv
        from nodes.ltx.decode import conv_vae as cv
        from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG
    except ImportError as error:
        return {"error": f"conv VAE bench helpers unavailable: {error}"}
    _ref, conv = build_conv(SHIPPED_CONV_VAE_CONFIG, device, dtype)
    latent = torch.randn(1, 128, *shape, device=device, dtype=dtype)
    return measure(lambda: cv.decode_conv(conv, latent), device, repeats)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs on the first shape (1 on the others)")
    parser.add_argument("--shapes", default="", help="comma-separated subset of the shape labels, e.g. 768x512x121")
    parser.add_argument("--skip-long", action="store_true", help="skip the 121 vs 241 frames budget case")
    parser.add_argument("--processors", default="sdpa,comfy_kitchen,natten", help="those available are run")
    parser.add_argument("--budget-gib", type=float, default=10.0, help="the auto-tiling budget case (weights in)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the measured bf16 ceiling of the H200")
    parser.add_argument("--sdpa-blocks", default="", help="extra sdpa spatial query blocks (h,w) to time on the first "
                        "shape, e.g. '8,8;16,16' (the default block is always timed)")
    parser.add_argument("--skip-diffusers", action="store_true")
    parser.add_argument("--skip-conv", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "bench_diffusion_vae.json")
                        if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    vae = build(TINY_METADATA if args.smoke else RELEASED_METADATA, device, dtype)
    shapes, long_shapes = (SMOKE_SHAPES, SMOKE_LONG) if args.smoke else (REAL_SHAPES, LONG_SHAPES)
    if args.shapes:
        shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
    if args.skip_long:
        long_shapes = {}
    weights = sum(t.numel() * t.element_size() for t in [*vae.parameters(), *vae.buffers()])
    budget = int(args.budget_gib * GiB) - weights
    if args.smoke:  # between the smallest tiles and one tile of the tiny long case: it must tile
        geometry, shape = vae.config.geometry(), list(SMOKE_LONG.values())[-1]
        memory = dv.memory_model(vae, 1, na.SdpaNAProcessor())
        frames, pixels = (2 * o for o in geometry.min_overlap)
        budget = (memory.estimate(dt.build_schedule(geometry, shape, frames, pixels))
                  + memory.estimate(dt.build_schedule(geometry, shape))) // 2
    available = [p for p in args.processors.split(",") if _available(p, device)]
    results: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "dtype": str(dtype), "params": sum(p.numel() for p in vae.parameters()),
        "auto_processor": na.make_processor("auto", device).name, "comfy_kitchen": na.comfy_kitchen_backends(),
        "natten": na.natten_status(), "processors": available, "budget_bytes": budget, "shapes": {}, "budget_case": {}}

    def flops_of(schedule, steps):
        return decode_flops(vae.config, schedule, steps)

    def save() -> None:
        if args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1, default=str)

    def record(table: dict, name: str, row: dict) -> None:
        if "seconds" in row and "tflop" in row:
            row["fraction_of_peak"] = row["tflop"] / row["seconds"] / args.peak_tflops
        table[name] = row
        print(f"[bench] {name}: {json.dumps(row, default=str)}", file=sys.stderr, flush=True)
        save()

    first = next(iter(shapes), None)
    for label, shape in shapes.items():
        latent = torch.randn(1, 128, *shape, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        table = results["shapes"].setdefault(label, {})
        repeats = args.repeats if label == first else 1
        reference: dict = {}  # the first processor's frames (sdpa: the reference the others are tested against)
        for processor in available:
            record(table, f"ours_{processor}_off", ours(vae, latent, device, repeats, flops_of, reference,
                                                        processor=processor, request=OFF))
        for block in filter(None, args.sdpa_blocks.split(";") if label == first else []):
            query_block = tuple(int(n) for n in block.split(","))
            record(table, f"ours_sdpa{query_block}_off", ours(vae, latent, device, repeats, flops_of,
                                                              processor=na.SdpaNAProcessor(query_block),
                                                              request=OFF))
        record(table, "ours_auto_auto", ours(vae, latent, device, repeats, flops_of, reference))
        reference.clear()
        record(table, "ours_auto_budget", ours(vae, latent, device, repeats, flops_of, free_memory=budget))
        if not args.skip_diffusers and not (args.smoke and label != first):  # flex on the CPU: ~20 s each
            for tiled in (False, True):
                record(table, f"diffusers_{'tiled' if tiled else 'untiled'}",
                       diffusers_decode(vae, latent, device, 1 if not args.smoke else repeats, tiled))
    for label, shape in long_shapes.items():
        latent = torch.randn(1, 128, *shape, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        record(results["budget_case"], label, ours(vae, latent, device, 1, flops_of, free_memory=budget))
    rows = list(results["budget_case"].values())
    if len(rows) == 2 and all("peak_bytes" in r for r in rows):
        results["budget_case"]["peak_ratio_long_over_short"] = rows[1]["peak_bytes"] / max(1, rows[0]["peak_bytes"])
    if not args.skip_conv and device.type == "cuda":
        del vae
        torch.cuda.empty_cache()
        for label, shape in shapes.items():
            record(results["shapes"][label], "conv_ours_auto", conv_decode(shape, device, dtype,
                                                                           args.repeats if label == first else 1))
    save()
    print(json.dumps(results, default=str))
    return 0


def _available(processor: str, device: torch.device) -> bool:
    """Processors worth timing here: sdpa always; comfy_kitchen with a fused GPU kernel (or eager on the CPU);
    natten only with libnatten (its CPU flex path takes minutes per tiny decode)."""
    try:
        na.make_processor(processor, device)
    except Exception as error:  # noqa: BLE001 - a missing backend is reported, it does not stop the bench
        print(f"[bench] {processor} unavailable: {error}", file=sys.stderr)
        return False
    if processor == "comfy_kitchen" and device.type == "cuda":
        return bool({"cuda", "triton"} & set(na.comfy_kitchen_backends()))
    return processor != "natten" or na.natten_status()[1]


if __name__ == "__main__":
    raise SystemExit(main())
