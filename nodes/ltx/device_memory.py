"""How much device memory a decode may plan with."""
from __future__ import annotations

import time
from typing import Callable

import torch


def free_bytes(device: torch.device) -> int:
    """The driver's free memory plus what PyTorch's caching allocator holds idle; "ample" off CUDA (the CPU
    budget is the caller's to give)."""
    if device.type != "cuda":
        return 1 << 62
    free, _total = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers: what a memory budget that includes the weights sets aside."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def start_meter(device: torch.device) -> Callable[[], tuple[float, int]]:
    """Reset `device`'s peak-memory counter and start a clock; the returned function reads (seconds, peak bytes)
    — the cost figures of a decode (peak 0 off CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()

    def read() -> tuple[float, int]:
        peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0
        return time.perf_counter() - start, peak
    return read
