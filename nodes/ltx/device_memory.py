"""How much device memory a decode may plan with."""
from __future__ import annotations

import time
from typing import Callable

import torch


AMPLE_BYTES = 1 << 62  # the free memory off CUDA: no limit


def free_bytes(device: torch.device) -> int:
    """The driver's free memory plus what PyTorch's caching allocator holds idle outside CUDA graphs' pools;
    "ample" off CUDA (the CPU budget is the caller's to give)."""
    if device.type != "cuda":
        return AMPLE_BYTES
    free, _total = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + idle - graph_pool_idle_bytes(device))


def graph_pool_idle_bytes(device: torch.device) -> int:
    """Bytes held idle in CUDA graphs' private memory pools on `device` (a captured sampler's intermediates between
    replays). The allocator counts them reserved and not allocated, but serves only the owning graph from them, so
    they are not free for a decode planned beside a loaded model that keeps its graphs."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sum(segment["total_size"] - segment["allocated_size"] for segment in torch.cuda.memory_snapshot()
               if segment.get("device", index) == index and tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0))


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
