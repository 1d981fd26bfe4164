"""Decoded frames in host memory: the float32 IMAGE tensor ComfyUI passes on, filled from the GPU.

A fresh pageable tensor takes its page faults inside the first device→host copy into it. Measured on the H200 host
(bench/bench_host_copy.py, docs/PERFORMANCE.md): copying 121 frames of 768×512 into fresh memory took 0.50 s, into
memory whose pages were already touched 0.05 s, and touching them 0.065 s. So the output is allocated, and its pages
touched on a background thread, when a decode starts: the GPU is busy far longer than that. Pinned memory would copy
faster still, but torch's pinned allocator rounds blocks up to a power of two and keeps them after they are freed.
"""
from __future__ import annotations

import threading

import torch


class HostFrames:
    """A host tensor of `shape` whose pages are being touched in the background until `ready()`."""

    def __init__(self, shape: tuple[int, ...], prefault: bool, dtype: torch.dtype = torch.float32) -> None:
        self._tensor = torch.empty(shape, dtype=dtype)
        self._thread: threading.Thread | None = None
        if prefault and self._tensor.numel():
            self._thread = threading.Thread(target=self._tensor.zero_, name="ltx25-prefault", daemon=True)
            self._thread.start()

    def ready(self) -> torch.Tensor:
        """The tensor, once the background touching is done (call before writing into it)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._tensor
