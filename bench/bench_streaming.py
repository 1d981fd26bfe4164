"""The LTX-2.5 DiT on smaller cards: step time with part of the 22B weights streamed from pinned host memory.

    python bench/bench_streaming.py --card-gib 0 48 24 16     # on the H200 (0 = uncapped, the resident reference)
    python bench/bench_streaming.py --smoke                   # tiny config on the CPU, to check the script

One run, one set of random bf16 weights at the real config and the real stage shapes (stage 1: video
[1,128,16,8,12], stage 2: [1,128,16,16,24], audio [1,8,126,16]). For each card size the model is placed by
`nodes.ltx.streaming.place` within the card's memory (its working memory from the sampler's estimate), then a filler
allocation takes everything beyond the card so the run really has only that much; the eager denoiser is timed per
stage, with the plan (resident/streamed blocks, bytes streamed per step), the achieved host→device rate against the
measured pinned-copy peak, the device peak and the host peak RSS. Card 0 is the uncapped resident reference, eager
and CUDA-graphed. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_transformer import REAL_SHAPES, SMOKE_SHAPES, build, median_seconds, sync  # noqa: E402
from nodes.comfy.bridge import FAST_PINNING  # noqa: E402
from nodes.ltx import streaming  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit import transformer as T  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import make_denoiser  # noqa: E402
from nodes.ltx.dit.sampling import working_memory  # noqa: E402
from nodes.ltx.dit.transformer import SHIPPED_CONFIG, TransformerConfig  # noqa: E402
from nodes.ltx.errors import LTX25Error  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block, tiny_metadata  # noqa: E402

GIB = 2**30
FPS = 24.0


def pinned_copy_rate(device: torch.device, gib: float = 2.0) -> float:
    """Host→device GB/s of one large copy from pinned memory (the link's practical peak)."""
    host = torch.empty(int(gib * GIB), dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device=device)
    dev.copy_(host, non_blocking=True)
    sync(device)
    start = time.perf_counter()
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    sync(device)
    return 3 * host.numel() / (time.perf_counter() - start) / 1e9


def pinned_alloc_rate(device: torch.device, gib: float = 4.0) -> dict:
    """GB/s of allocating new pinned host memory and copying a device tensor into it (what a first pinned eviction
    does), with torch's default pinned allocator and with `pinned_use_cuda_host_register` (malloc + register from
    several threads), each on a fresh size so the caching allocator cannot reuse a block."""
    source = torch.empty(int(gib * GIB), dtype=torch.uint8, device=device)
    rates = {}
    for k, setting in enumerate((None, FAST_PINNING)):
        if setting is not None:
            try:
                torch.cuda.memory._set_allocator_settings(setting)
            except (RuntimeError, AttributeError) as error:
                rates["host_register"] = f"unavailable: {error}"
                break
        part = source[: source.numel() - (k + 1) * 4096]
        sync(device)
        start = time.perf_counter()
        host = torch.empty(part.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(part, non_blocking=True)
        sync(device)
        rates["default" if setting is None else "host_register"] = part.numel() / (time.perf_counter() - start) / 1e9
        del host
    return rates


def evict_and_place(model, device: torch.device, budget: int, working: int, stage2, cond) -> dict:
    """What a run pays when the decoders evict the transformer and the next run places it again: offload, then
    place, three times: into pageable memory (`keep_host` off), the first pinned eviction (it allocates the pinned
    copies) and a later one (the host copies are reused: offload only drops device tensors); the stage-2 x0 after
    each placement compared bit for bit with the first."""
    video, audio = stage2
    streaming.place(model, device, budget, working, where="bench")
    want = make_denoiser(model, cond, FPS, "eager")(video, audio, 0.5)[0].clone()
    out = {}
    for name, keep in (("pageable", False), ("pinned_first", True), ("pinned", True)):
        sync(device)
        start = time.perf_counter()
        streaming.offload(model, keep_host=keep)
        sync(device)
        offloaded = time.perf_counter() - start
        start = time.perf_counter()
        plan = streaming.place(model, device, budget, working, where="bench", keep_host=keep)
        sync(device)
        placed = time.perf_counter() - start
        got = make_denoiser(model, cond, FPS, "eager")(video, audio, 0.5)[0]
        out[name] = {"offload_s": offloaded, "place_s": placed, "resident_blocks": plan.resident_blocks,
                     "x0_equal": bool(torch.equal(got, want))}
    streaming.offload(model)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card-gib", type=float, nargs="+", default=[0, 48, 24, 16])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    block = {**tiny_config_block(), "num_layers": 6} if args.smoke else dict(SHIPPED_CONFIG)
    config = TransformerConfig.from_metadata("bench", tiny_metadata(block))
    model = build(config, device, torch.bfloat16)
    shapes = SMOKE_SHAPES if args.smoke else REAL_SHAPES
    width_v, width_a = config.cross_attention_dim, config.audio_cross_attention_dim
    g = torch.Generator(device).manual_seed(0)
    cond = Conditioning(torch.randn(1, 1024, width_v, device=device, generator=g, dtype=torch.bfloat16),
                        torch.randn(1, 1024, width_a, device=device, generator=g, dtype=torch.bfloat16))
    inputs = {stage: (torch.randn(v, device=device, generator=g), torch.randn(a, device=device, generator=g))
              for stage, (v, a) in shapes.items()}
    working = max(working_memory(model, v.shape, a.shape) for v, a in inputs.values())
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "weights_gib": streaming.tensor_bytes(list(model.state_dict().values()))
              / GIB, "working_gib_estimate": working / GIB, "cards": []}
    if device.type == "cuda":
        result["pinned_h2d_gbps"] = pinned_copy_rate(device)
        result["pinned_alloc_and_d2h_gbps"] = pinned_alloc_rate(device)
    for card in args.card_gib:
        row: dict = {"card_gib": card}
        budget = int(card * GIB) if card else 1 << 62
        try:
            plan = streaming.place(model, device, budget, working, where=f"card {card} GiB")
        except LTX25Error as error:
            row["error"] = str(error)
            result["cards"].append(row)
            continue
        row["plan"] = plan.describe("transformer")
        row["resident_blocks"], row["streamed_gib_per_step"] = plan.resident_blocks, plan.streamed_bytes / GIB
        filler = None
        if card and device.type == "cuda":
            torch.cuda.empty_cache()
            free, _total = torch.cuda.mem_get_info(device)
            spare = free - (int(card * GIB) - torch.cuda.memory_allocated(device))
            if spare > 0:
                filler = torch.empty(spare, dtype=torch.uint8, device=device)
            torch.cuda.reset_peak_memory_stats(device)
        try:
            for stage, (video, audio) in inputs.items():
                denoise = make_denoiser(model, cond, FPS, "eager")
                seconds = median_seconds(lambda: denoise(video, audio, 0.5), device, args.runs, warmup=1)
                row[f"{stage}_s_per_step"] = seconds
                if plan.streamed_bytes:
                    row[f"{stage}_h2d_gbps"] = plan.streamed_bytes / seconds / 1e9
                if not card and device.type == "cuda":
                    graphed = make_denoiser(model, cond, FPS, "cuda_graph")
                    row[f"{stage}_graph_s_per_step"] = median_seconds(lambda: graphed(video, audio, 0.5), device,
                                                                       args.runs, warmup=1)
            row["sampling_8_3_s"] = 8 * row["stage1_s_per_step"] + 3 * row["stage2_s_per_step"]
            if device.type == "cuda":
                row["device_peak_gib"] = (torch.cuda.max_memory_allocated(device)
                                          - (filler.numel() if filler is not None else 0)) / GIB
        except torch.OutOfMemoryError as error:
            row["error"] = f"out of memory: {str(error).splitlines()[0]}"
        finally:
            del filler
            streaming.remove_streamer(model)
            vars(model).pop("_ltx25_graphs", None)
            model.release_caches()
            torch.cuda.empty_cache() if device.type == "cuda" else None
        if device.type == "cuda" and "error" not in row:
            row["evict_and_place"] = evict_and_place(model, device, budget, working, inputs["stage2"], cond)
        row["host_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result["cards"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
