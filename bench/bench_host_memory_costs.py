"""What the compare node's host memory traffic costs, piece by piece, at the A/B's size (121 frames of 768×512 float
per decoder, a 1536×512 canvas): uploading both decodes to the GPU from pageable memory, from pinned memory, and
through `pin_memory()` copies of 8-frame chunks; pinning a buffer (a fresh cudaHostAlloc, the caching host
allocator's reuse, cudaHostRegister of a pageable one); writing a fresh pageable buffer (page faults) against one
already written. Also prints the kernel's transparent huge page mode.

    python bench/bench_host_memory_costs.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def timed(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return round(statistics.median(seconds), 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = (121, 512, 768, 3)
    pageable = [torch.rand(shape) for _ in range(2)]
    pinned = [t.pin_memory() for t in pageable]
    device = torch.device("cuda")
    torch.empty(1, device=device)

    def upload(tensors):
        for t in tensors:
            for f0 in range(0, shape[0], 8):
                t[f0:f0 + 8].to(device, non_blocking=True)

    def fresh_pinned():
        torch._C._host_emptyCache()  # the last call's block (freed when it returned) is released: this one is new
        torch.empty(shape, pin_memory=True)

    def upload_through_pin_memory(tensors):
        for t in tensors:
            for f0 in range(0, shape[0], 8):
                t[f0:f0 + 8].pin_memory().to(device, non_blocking=True)

    def register():
        buffer = torch.empty(shape)
        cudart = torch.cuda.cudart()
        assert int(cudart.cudaHostRegister(buffer.data_ptr(), buffer.numel() * 4, 0)) == 0
        assert int(cudart.cudaHostUnregister(buffer.data_ptr())) == 0

    canvas_shape = (121, 512, 1536, 3)
    written = torch.empty(canvas_shape)
    written.fill_(0)
    costs = {
        "upload_pageable_2x570MB": lambda: upload(pageable),
        "upload_pinned_2x570MB": lambda: upload(pinned),
        "upload_through_pin_memory_2x570MB": lambda: upload_through_pin_memory(pageable),
        "pin_fresh_570MB": fresh_pinned,
        "pin_cached_570MB": lambda: torch.empty(shape, pin_memory=True),
        "host_register_570MB": register,
        "fill_fresh_canvas_1.14GB": lambda: torch.empty(canvas_shape).fill_(0),
        "fill_written_canvas_1.14GB": lambda: written.fill_(0),
        "clamp_into_fresh_canvas": lambda: _canvas(pageable, torch.empty(canvas_shape)),
        "clamp_into_written_canvas": lambda: _canvas(pageable, written),
        "clamp_pinned_into_written_canvas": lambda: _canvas(pinned, written),
    }
    row = {"threads": torch.get_num_threads()}
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            row["thp"] = f.read().strip()
    except OSError:
        row["thp"] = "unknown"
    for name, fn in costs.items():
        fn()
        row[name] = timed(fn, args.repeats)
        print(f"[cost] {name}: {row[name]} s", flush=True)
    print(json.dumps(row))


def _canvas(halves, canvas):
    for i, half in enumerate(halves):
        torch.clamp(half, 0, 1, out=canvas[:, :, i * 768:(i + 1) * 768])


if __name__ == "__main__":
    main()
