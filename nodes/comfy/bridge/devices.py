"""Devices and their memory: where models compute and rest, what is free, what can ever fit, the headless VRAM
budget."""
from __future__ import annotations

import math
import os

import torch

from ...ltx import memory_fit
from ...ltx.device_memory import free_bytes
from ...ltx.errors import LTX25Error
from ...ltx.memory_fit import host_available_bytes
from .comfyui import HAS_COMFY, _mm


def compute_device() -> torch.device:
    if HAS_COMFY:
        return _mm.get_torch_device()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def offload_device() -> torch.device:
    return _mm.unet_offload_device() if HAS_COMFY else torch.device("cpu")


def intermediate_device() -> torch.device:
    """Where latents, images and audio live between nodes (the CPU unless ComfyUI says otherwise)."""
    return _mm.intermediate_device() if HAS_COMFY else torch.device("cpu")


def free_device_memory(device: torch.device | None = None) -> int:
    device = device or compute_device()
    if HAS_COMFY:
        return int(_mm.get_free_memory(device))
    return free_bytes(device)


def memory_limit(device: torch.device | None = None) -> int:
    """The most memory work on `device` can ever have, for refusing what can never fit (not for planning): the
    host's available memory for the CPU; a GPU's total (model management can evict every other model), within
    the headless VRAM budget when one is set."""
    device = device or compute_device()
    if device.type == "cpu":
        return host_available_bytes()
    if HAS_COMFY:
        total = int(_mm.get_total_memory(device))
    elif device.type == "cuda":
        total = int(torch.cuda.mem_get_info(device)[1])
    else:
        return host_available_bytes()  # other accelerators share the host's memory
    cap = _budget_cap()
    return min(total, cap) if cap is not None else total


def check_fits(where: str, what: str, needed: int, device: torch.device, hint: str) -> None:
    """Refuse, naming `where` and both figures, work whose `needed` bytes exceed `memory_limit(device)`."""
    memory = "host memory" if device.type == "cpu" else f"{device.type} memory"
    memory_fit.check_fits(where, what, needed, memory_limit(device), memory, hint)


def empty_cache() -> None:
    if HAS_COMFY:
        _mm.soft_empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


# The VRAM budget: `set_vram_budget_gb` (the headless runner's option) or `LTX25_VRAM_BUDGET_GB`.
PLACEMENT_HEADROOM = 1 << 30  # bytes left free beside a standalone placement
_vram_budget_override: int | None = None


def set_vram_budget_gb(gigabytes: float | None) -> None:
    """Headless: cap the device memory the pack's models and their work may use (None: what is free)."""
    global _vram_budget_override
    if gigabytes is not None and not (math.isfinite(gigabytes) and int(gigabytes * 2**30) > 0):
        raise LTX25Error("--vram-budget-gb", "the budget", gigabytes, "a number of GiB above 0")
    _vram_budget_override = None if gigabytes is None else int(gigabytes * 2**30)


def _budget_cap() -> int | None:
    if _vram_budget_override is not None:
        return _vram_budget_override
    value = os.environ.get("LTX25_VRAM_BUDGET_GB")
    return int(float(value) * 2**30) if value else None
