"""How much device memory a decode may plan with."""
from __future__ import annotations

import torch


def free_bytes(device: torch.device) -> int:
    """The driver's free memory plus what PyTorch's caching allocator holds idle; "ample" off CUDA (the CPU
    budget is the caller's to give)."""
    if device.type != "cuda":
        return 1 << 62
    free, _total = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
