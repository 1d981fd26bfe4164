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
        self._error: BaseException | None = None
        if prefault and self._tensor.numel():
            self._thread = threading.Thread(target=self._touch, name="ltx25-prefault", daemon=True)
            self._thread.start()

    def _touch(self) -> None:
        try:
            # Inference mode is per thread: a tensor made under it (every node runs there) can only be written
            # to under it, on this thread too.
            with torch.inference_mode(self._tensor.is_inference()):
                self._tensor.zero_()
        except BaseException as error:  # noqa: BLE001 - handed to the decoding thread by ready()
            self._error = error

    def ready(self) -> torch.Tensor:
        """The tensor, once the background touching is done (call before writing into it)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        return self._tensor
