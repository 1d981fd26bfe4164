"""Progress for engine loops: ComfyUI's progress bar with live previews, or a line on stderr headless."""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable

import torch

from .comfy_models import _restore_in_use
from .comfyui import HAS_COMFY, _comfy_utils, _mm
from .interrupts import check_interrupt

log = logging.getLogger("ltx25")


class _StderrProgress:
    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.value = total, label, 0

    def update_absolute(self, value: int, total: int | None = None) -> None:
        self.value, self.total = value, total or self.total
        if os.environ.get("LTX25_QUIET") != "1":
            print(f"\r[{self.label}] {self.value}/{self.total}", end="\n" if value >= self.total else "",
                  file=sys.stderr, flush=True)


def step_callback(total: int, label: str = "ltx25", preview_latent: bool = False) -> Callable[..., None]:
    """A callback for engine loops: checks for interrupt, then reports `done/total` progress.

    With `preview_latent` it also takes the step's x0 video latent `[B, 128, F', H', W']` as a third argument and,
    under ComfyUI, shows its first frame on the running node as core's samplers do: ComfyUI's own previewer for the
    user's preview method with core's LTX-2 latent format (its latent→RGB factors), sent with the progress value.
    Headless, or with previews off, x0 is ignored."""
    bar = _comfy_utils.ProgressBar(total) if HAS_COMFY else _StderrProgress(total, label)
    previewer = _ltx_video_previewer() if preview_latent and HAS_COMFY else None

    def on_step(done: int, total_now: int, x0_video: torch.Tensor | None = None) -> None:
        check_interrupt()
        if previewer is None or x0_video is None:
            bar.update_absolute(done, total_now)
            return
        bar.update_absolute(done, total_now, previewer.decode_latent_to_preview_image("JPEG", x0_video))
        _restore_in_use()  # a TAE previewer loads its model through model management, which may evict ours

    return on_step


def _ltx_video_previewer():
    """ComfyUI's previewer for LTX-2 video latents (`LTXAV`'s factors; `LTXV`'s on versions before LTX-2), or None
    when the user turned previews off or this ComfyUI has no previewer to offer."""
    try:
        import comfy.latent_formats as latent_formats
        import latent_preview
    except ImportError as error:
        log.warning("LTX-2.5: no live previews, ComfyUI's latent_preview is not importable (%s)", error)
        return None
    latent_format = getattr(latent_formats, "LTXAV", None) or latent_formats.LTXV
    return latent_preview.get_previewer(_mm.get_torch_device(), latent_format())
