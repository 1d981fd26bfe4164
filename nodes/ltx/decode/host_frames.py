"""Decoded frames in host memory: the float32 IMAGE tensor ComfyUI passes on, filled from the GPU.

A fresh pageable tensor takes its page faults inside the first device→host copy into it, which makes that copy
several times slower than a copy into memory whose pages were already touched (bench/bench_host_copy.py,
docs/PERFORMANCE.md). So the output is allocated, and its pages touched on a background thread, when a decode
starts: the GPU is busy far longer than the touching takes (the touch writes zeros, so a decoder may also add
into the frames: the diffusion decoder's tiles are blended there). Pinned memory would copy faster still, but
torch's pinned allocator rounds blocks up to a power of two and keeps them after they are freed.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch


class HostFrames:
    """A host tensor of `shape` whose pages are being touched in the background until `ready()`; with `prefault`
    it is all zeros then."""

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


class DeviceToHost:
    """Copies device tensors into host tensors without holding up the device's queue.

    A plain `host.copy_(device_tensor)` into pageable memory waits for the device to drain, copies through the
    driver's staging, and only then lets the next kernels be queued. Here each piece is copied in chunks of at most
    `chunk_bytes` into one of two pinned staging buffers on a side stream, and a worker thread moves each chunk into
    place once its copy is done. The caller waits only when both buffers are busy, so the last two chunks of a piece
    (all of a small one) are moved while the device goes on with the next tile; a large piece still holds the caller
    until the rest has left. It pays off on large untiled decodes, not at small tiles (docs/PERFORMANCE.md).
    The two buffers are kept for the process (2 × 64 MiB pinned): pinning fresh memory per decode costs more
    than the copies it speeds up.
    """

    _staging: dict = {}  # (device, chunk bytes) → (lock, two pinned byte buffers)

    def __init__(self, device: torch.device, chunk_bytes: int = 64 << 20) -> None:
        self.device, self.chunk_bytes = device, chunk_bytes
        key = (device, chunk_bytes)
        if key not in self._staging:
            self._staging[key] = (threading.Lock(), [_pinned(chunk_bytes), _pinned(chunk_bytes)])
        lock, buffers = self._staging[key]
        # a second decode running at the same time (another thread) gets buffers of its own (torch's pinned
        # allocator keeps them cached afterwards)
        self._lock = lock if lock.acquire(blocking=False) else None
        try:
            self.buffers = buffers if self._lock is not None else [_pinned(chunk_bytes), _pinned(chunk_bytes)]
            self.stream = torch.cuda.Stream(device)
            self.mover = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltx25-to-host")
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise
        self.moves: list = [None, None]  # the pending move out of each buffer
        self.tasks: list = []            # pending `then` work
        self.turn = 0

    def copy(self, dst: torch.Tensor, src: torch.Tensor, accumulate: bool = False) -> None:
        """`dst.copy_(src)` (with `accumulate`: `dst.add_(src)`), later: `dst` (host) must not be read before
        `finish()`; `src` may be freed right away."""
        per_row = src[0].numel() * src.element_size() if src.shape[0] else 1
        step = max(1, self.chunk_bytes // per_row)
        if step * per_row > self.chunk_bytes:  # one row is larger than a buffer: copy it directly
            self.finish_moves()
            dst.add_(src.to(dst.device)) if accumulate else dst.copy_(src)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for start in range(0, src.shape[0], step):
            part = src[start:start + step]
            buffer = self.buffers[self.turn]
            if self.moves[self.turn] is not None:
                self.moves[self.turn].result()                      # its previous chunk has left it
            staged = buffer[:part.numel() * part.element_size()].view(part.dtype).view(part.shape)
            with torch.cuda.stream(self.stream):
                staged.copy_(part, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.stream)
            self.moves[self.turn] = self.mover.submit(_move, done, staged, dst[start:start + step], accumulate)
            self.turn = 1 - self.turn
        src.record_stream(self.stream)  # its memory is not reused before the side stream has read it

    def then(self, work: Callable[[], object]) -> None:
        """Run `work` on the mover thread once every piece handed to `copy` before has been moved into place (the
        mover takes its tasks in order): host-side work on frames whose last piece is on its way."""
        self.tasks.append(self.mover.submit(_in_inference_mode, work))

    def finish_moves(self) -> None:
        for i, move in enumerate(self.moves):
            if move is not None:
                move.result()
                self.moves[i] = None
        while self.tasks:
            self.tasks.pop(0).result()

    def finish(self) -> None:
        """Wait for every copy (re-raising a failed one) and release the worker."""
        try:
            self.finish_moves()
        finally:
            self.mover.shutdown(wait=True)
            if self._lock is not None:
                self._lock.release()
                self._lock = None


class DirectCopy:
    """`DeviceToHost`'s interface where no staging is wanted (a CPU decode, output kept on the device): each copy
    happens at once."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, accumulate: bool = False) -> None:
        dst.add_(src.to(dst.device)) if accumulate else dst.copy_(src)

    def then(self, work: Callable[[], object]) -> None:
        work()

    def finish_moves(self) -> None:
        pass

    def finish(self) -> None:
        pass


def host_copier(device: torch.device, staged: bool = True) -> DeviceToHost | DirectCopy:
    """How a decode on `device` hands finished frames out: through `DeviceToHost` on CUDA when `staged` (the
    frames go to host memory), else plainly. Call `finish()` before the frames are read."""
    return DeviceToHost(device) if staged and device.type == "cuda" else DirectCopy()


def _pinned(size: int) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def _move(done: "torch.cuda.Event", staged: torch.Tensor, dst: torch.Tensor, accumulate: bool = False) -> None:
    done.synchronize()
    with torch.inference_mode(dst.is_inference()):
        dst.add_(staged) if accumulate else dst.copy_(staged)


def _in_inference_mode(work: Callable[[], object]) -> None:
    # the decode's tensors were made under inference mode, which is per thread: writing them here needs it too
    with torch.inference_mode():
        work()
