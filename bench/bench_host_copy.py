"""Handing decoded frames to host memory: what each way of copying a `[F, H, W, 3]` float32 video off the GPU costs.

    python bench/bench_host_copy.py                 # CUDA, 121×512×768 and 121×1088×1920
    python bench/bench_host_copy.py --smoke         # CPU (checks the script runs; numbers mean nothing)

A ComfyUI IMAGE is float32 in host memory, so every decoder ends with this copy (572 MB at 768×512×121). Variants,
each timed from "frames ready on the GPU" to "frames usable on the host" (median of --repeats):
- `pageable`: a fresh `torch.empty` host tensor, `copy_` (the first touch of every page happens inside the copy);
- `pageable_prefaulted_copy`: only the copy, into a host tensor whose pages were touched before (the fault cost
  can be paid while the GPU decodes);
- `prefault`: the page-touching alone (`torch.empty(...).zero_()` — or `fill_`, what a background thread would do);
- `pinned`: `torch.empty(pin_memory=True)` + non-blocking copy (allocation included);
- `staged`: chunks through two pinned staging buffers into a pre-faulted pageable tensor;
- `fp16_then_float`: copy half precision into a pre-faulted pageable fp16 tensor, widen on the host.
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SHAPES = {"768x512x121": (121, 512, 768, 3), "1920x1088x121": (121, 1088, 1920, 3)}


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def staged_copy(src: torch.Tensor, dst: torch.Tensor, stages: list[torch.Tensor]) -> None:
    """src (device, contiguous) → dst (host) through alternating pinned buffers; the host memcpy of one chunk
    overlaps the device→host copy of the next."""
    flat_src, flat_dst = src.view(-1), dst.view(-1)
    chunk = stages[0].numel()
    pending: list = [None, None]  # per buffer: (event, start, count) of the chunk it holds

    def drain(slot: int) -> None:
        if pending[slot] is not None:
            event, start, n = pending[slot]
            event.synchronize()
            flat_dst[start:start + n].copy_(stages[slot][:n])
            pending[slot] = None

    for i, start in enumerate(range(0, flat_src.numel(), chunk)):
        slot, n = i % 2, min(chunk, flat_src.numel() - start)
        drain(slot)  # that buffer's previous chunk must be out first
        stages[slot][:n].copy_(flat_src[start:start + n], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        pending[slot] = (event, start, n)
    drain(0)
    drain(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shapes = {"32x32x9": (9, 32, 32, 3)} if args.smoke else SHAPES
    results = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "host_threads": torch.get_num_threads(), "shapes": {}}
    for label, shape in shapes.items():
        frames = torch.rand(shape, device=device)
        row = {"bytes": frames.numel() * 4}
        row["pageable"] = timed(lambda: torch.empty(shape).copy_(frames), args.repeats)
        row["prefault"] = timed(lambda: torch.empty(shape).zero_(), args.repeats)
        host = torch.empty(shape).zero_()
        row["pageable_prefaulted_copy"] = timed(lambda: host.copy_(frames), args.repeats)
        if cuda:
            row["pinned"] = timed(lambda: torch.empty(shape, pin_memory=True).copy_(frames, non_blocking=True),
                                  args.repeats)
            pinned = torch.empty(shape, pin_memory=True)
            row["pinned_preallocated_copy"] = timed(lambda: pinned.copy_(frames, non_blocking=True), args.repeats)
            del pinned
            stages = [torch.empty(2**24, pin_memory=True) for _ in range(2)]  # 2 × 64 MB
            row["staged"] = timed(lambda: staged_copy(frames, host, stages), args.repeats)
            if not torch.equal(host, frames.cpu()):
                row["staged_error"] = "staged copy differs"
        half_host = torch.empty(shape, dtype=torch.float16).zero_()
        row["fp16_then_float"] = timed(lambda: half_host.copy_(frames.half()).float(), args.repeats)
        results["shapes"][label] = row
        print(f"[host_copy] {label}: {row}", flush=True)
        del frames, host, half_host
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
