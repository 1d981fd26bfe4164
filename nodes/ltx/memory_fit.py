"""Refusing work that cannot fit, before it starts: a step's estimate (the latents' or decoded frames' bytes, a
component's `working_memory(...)`) against the memory the machine has, both in the message with what to change.
Without it a clip far too large failed in the allocator with an error that named no node, or made the sampler
grind for minutes before running out."""
from __future__ import annotations

import math
import os
from typing import Sequence

from .errors import LTX25Error
from .geometry import pixel_shape

FLOAT32_BYTES = 4  # latents and decoded frames live in float32 between nodes


def host_available_bytes() -> int:
    """Host memory a new allocation can get: the kernel's MemAvailable (free plus reclaimable cache) on Linux, else
    the free physical pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass  # no procfs (macOS, Windows): the sysconf figure below
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def tensor_bytes(*shapes: Sequence[int], itemsize: int = FLOAT32_BYTES) -> int:
    return sum(math.prod(shape) for shape in shapes) * itemsize


def frames_bytes(latent_shape: Sequence[int]) -> int:
    """Bytes of the float32 frames `[B·F, H, W, 3]` a video decoder makes from a `[B, 128, F', H', W']` latent."""
    frames, height, width = pixel_shape(tuple(latent_shape[2:]))
    return tensor_bytes((latent_shape[0], frames, height, width, 3))


def gib(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB"


def check_fits(where: str, what: str, needed: int, available: int, memory: str, hint: str) -> None:
    """Refuse when `needed` bytes exceed `available` bytes of `memory` ("host memory", "cuda memory"):
    `<where>: <what> is N GiB, expected at most the M GiB of <memory> available. <hint>`."""
    if needed > available:
        raise LTX25Error(where, what, gib(needed), f"at most the {gib(available)} of {memory} available", hint)
