"""The A/B viewer's preview frames: PNGs of a few frames of each decode, in ComfyUI's temp folder, which the canvas
extension (web/ltx25_ab_viewer.js) fetches from `/view`.

They are written on a small thread pool after the compare node returns: the next nodes (the side-by-side save)
need the compare's outputs, not these files. Each file appears whole (written aside, then renamed), and the viewer
asks again for a frame that is not there yet. `wait_for_previews` waits for the frames started so far (tests, a
benchmark between runs); `removed_afterwards` deletes a headless run's frames, which no viewer will show.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Iterator

import numpy as np
import torch
from PIL import Image

log = logging.getLogger(__name__)
MAX_FRAMES = 24  # frames shown per side: enough to scrub through a clip, few enough to write in the background
WRITERS = 4
_POOL = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="ltx25-previews")  # workers start on first use
_PENDING: set[Future] = set()
_PENDING_LOCK = threading.Lock()
_started: list[str] | None = None  # paths of the frames started inside `removed_afterwards`


def preview_frame_indices(count: int, max_frames: int = MAX_FRAMES) -> list[int]:
    """Up to `max_frames` evenly spaced frame indices, first and last included."""
    shown = min(count, max_frames)
    return sorted({round(i * (count - 1) / max(1, shown - 1)) for i in range(shown)})


def write_preview_frames(frames: torch.Tensor, folder: str, prefix: str, picks: list[int]) -> list[str]:
    """Start writing the frames `[F, H, W, 3]` at `picks` as PNGs into `folder` and return their file names at
    once. A failed write is logged (the node has returned: there is nothing to raise into)."""
    os.makedirs(folder, exist_ok=True)
    tag = uuid.uuid4().hex[:8]  # a fresh name per run, so the browser never shows a cached frame
    names = [f"{prefix}_{tag}_{index:05d}.png" for index in picks]
    for index, name in zip(picks, names):
        path = os.path.join(folder, name)
        if _started is not None:
            _started.append(path)
        job = _POOL.submit(_write, frames, index, path)
        with _PENDING_LOCK:
            _PENDING.add(job)
        job.add_done_callback(_written)  # runs on the writing thread (here if already done)
    return names


def _write(frames: torch.Tensor, index: int, path: str) -> None:
    try:
        pixels = (frames[index].detach().to("cpu", torch.float32).clamp(0, 1).numpy() * 255).round()
        Image.fromarray(pixels.astype(np.uint8)).save(path + ".part", format="png",
                                                      compress_level=1)  # ComfyUI's preview level
        os.replace(path + ".part", path)
    except Exception as error:  # noqa: BLE001 - logged: the node that started it has returned
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + ".part")
        log.warning("LTX-2.5 A/B viewer: preview frame %s was not written: %s", os.path.basename(path), error)


def _written(job: Future) -> None:
    with _PENDING_LOCK:
        _PENDING.discard(job)


def wait_for_previews(timeout: float | None = None) -> None:
    """Wait until every preview frame started so far is written (or has failed)."""
    with _PENDING_LOCK:
        pending = list(_PENDING)
    wait(pending, timeout)


@contextlib.contextmanager
def removed_afterwards() -> Iterator[None]:
    """Preview frames started inside are deleted when it ends, however it ends (once written): a headless run has
    no viewer, and ComfyUI, which empties its temp folder when it starts and stops, is not there to do it."""
    global _started
    outer, _started = _started, []
    try:
        yield
    finally:
        started, _started = _started, outer
        wait_for_previews()
        for path in started:
            with contextlib.suppress(FileNotFoundError):  # a frame whose write failed
                os.remove(path)
