"""The decoder A/B: per-frame PSNR and SSIM between two decoded videos, a labelled side-by-side canvas, and the
JSON report that goes with it. Frames are float [F, H, W, 3] in [0, 1]."""
from __future__ import annotations

import json
import math
from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from .stats import DecodeStats
from ..errors import LTX25Error

SSIM_C1, SSIM_C2 = 0.01**2, 0.03**2  # Wang et al. 2004 with data range 1


FRAMES_PER_CHUNK = 8  # frames moved to the metric device at a time: bounds its memory at any clip length


def _chunks(a: torch.Tensor, b: torch.Tensor, device: torch.device | None):
    """(x, y) frame chunks of A and B on `device` (None: where they are) in float64 on the CPU and float32 on a GPU
    (consumer GPUs run float64 at 1/64 rate; SSIM's variances in float32 are good to ~1e-7)."""
    device = device or a.device
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    for f0 in range(0, a.shape[0], FRAMES_PER_CHUNK):
        yield (_upload(t[f0:f0 + FRAMES_PER_CHUNK], device, dtype) for t in (a, b))


def _upload(frames: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`frames` on `device` in `dtype`. Pageable frames go to a GPU through a pinned copy first: the driver stages
    a pageable upload on one thread (several times slower than an upload from pinned memory), while torch copies
    into pinned memory on all cores, into blocks its pinned cache reuses."""
    if device.type == "cuda" and frames.device.type == "cpu" and not frames.is_pinned():
        frames = frames.pin_memory()
    return frames.to(device, dtype, non_blocking=True)


def _mse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-frame mean squared error of `[F, H, W, 3]` frames (on their device)."""
    return ((x - y) ** 2).flatten(1).mean(1)


def _psnr(mse: torch.Tensor) -> list[float]:
    """PSNR of each frame's MSE (data range 1); +inf for identical frames."""
    return [math.inf if m == 0 else 10 * math.log10(1.0 / float(m)) for m in mse.double().cpu()]


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def _ssim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-frame SSIM of `[F, H, W, 3]` frames: mean over channels with an 11×11 Gaussian window (σ 1.5), valid
    region only; 1.0 when identical."""
    x, y = (t.permute(0, 3, 1, 2) for t in (x, y))  # [F, 3, H, W]
    g = _gaussian_window((min(11, x.shape[-2], x.shape[-1]) - 1) // 2 * 2 + 1).to(x.device, x.dtype)
    channels = x.shape[1]
    kh = g.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)
    kw = g.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(t, kh, groups=channels), kw, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    ssim = ((2 * mu_x * mu_y + SSIM_C1) * (2 * cov + SSIM_C2)) / ((mu_x**2 + mu_y**2 + SSIM_C1) * (var_x + var_y + SSIM_C2))
    return ssim.flatten(1).mean(1)


def psnr_and_ssim_per_frame(a: torch.Tensor, b: torch.Tensor, device: torch.device | None = None,
                            check: Callable[[], None] | None = None) -> tuple[list[float], list[float]]:
    """(PSNR, SSIM) per frame, B against A, from one pass over the frames: each chunk goes to `device` once.
    `check()` runs before each chunk (it raises to interrupt)."""
    mse, ssim = [], []
    for x, y in _chunks(a, b, device):  # results stay on the device: no wait per chunk for the next one's copy
        if check is not None:
            check()
        mse.append(_mse(x, y))
        ssim.append(_ssim(x, y))
    return _psnr(torch.cat(mse)), [float(v) for v in torch.cat(ssim).double().cpu()]


def check_comparable(a: torch.Tensor, b: torch.Tensor, resize: bool) -> torch.Tensor:
    """B resized to A's size when asked; otherwise sizes and frame counts must match."""
    for name, t in (("images_a", a), ("images_b", b)):
        if t.ndim != 4 or t.shape[-1] != 3:
            raise LTX25Error(name, "the image batch shape", tuple(t.shape), "[frames, height, width, 3]")
    if a.shape[0] != b.shape[0]:
        raise LTX25Error("images_b", "the frame count", b.shape[0], f"{a.shape[0]} like images_a",
                         "Decode the same latent with both decoders.")
    if a.shape[1:3] != b.shape[1:3]:
        if not resize:
            raise LTX25Error("images_b", "the frame size", f"{b.shape[2]}×{b.shape[1]}",
                             f"{a.shape[2]}×{a.shape[1]} like images_a", "Set resize_b to true to compare anyway.")
        b = F.interpolate(b.permute(0, 3, 1, 2), size=a.shape[1:3], mode="bilinear", align_corners=False,
                          antialias=True).permute(0, 2, 3, 1).clamp(0, 1)
    return b


def _label_patch(text: str, height: int, width: int) -> torch.Tensor:
    """White text on black, `[h, w, 3]` float, cropped to fit a `height × width` half."""
    stamp = Image.new("RGB", (8 + 7 * len(text), 18), (0, 0, 0))
    ImageDraw.Draw(stamp).text((4, 3), text, fill=(255, 255, 255))
    return torch.from_numpy(np.asarray(stamp)[:height, :width].copy()).float() / 255.0


def side_by_side(a: torch.Tensor, b: torch.Tensor, label_a: str, label_b: str, layout: str) -> torch.Tensor:
    """[F, H, W, 3] ×2 → [F, H, 2W, 3] ("side_by_side") or [F, 2H, W, 3] ("stacked"), each half labelled.
    Float throughout: a uint8 round trip is slow on long clips and quantizes both halves."""
    height, width = a.shape[1:3]
    origins = ((0, 0), (0, width) if layout == "side_by_side" else (height, 0))
    frames = a.shape[0]
    canvas = torch.empty(frames, *((height, 2 * width) if layout == "side_by_side" else (2 * height, width)), 3,
                         dtype=torch.result_type(a, b), device=a.device)
    for half, (y0, x0) in zip((a, b), origins):  # clamped straight into place: one pass, no concatenated copy
        torch.clamp(half.to(canvas.dtype), 0, 1, out=canvas[:, y0:y0 + height, x0:x0 + width])
    for text, (y0, x0) in zip((label_a, label_b), origins):
        patch = _label_patch(text, height, width)
        canvas[:, y0:y0 + patch.shape[0], x0:x0 + patch.shape[1]] = patch
    return canvas


def check_labels(label_a: str, label_b: str) -> None:
    if label_a == label_b:
        raise LTX25Error("label_b", "the label", repr(label_b), "different from label_a",
                         "The report keys each decoder by its label.")


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def compare_report(a: torch.Tensor, b: torch.Tensor, labels: tuple[str, str],
                   stats: Mapping[str, DecodeStats | None], device: torch.device | None = None,
                   check: Callable[[], None] | None = None) -> dict:
    """The A/B report: per-frame and mean PSNR/SSIM (B against A, computed on `device`) plus each decoder's cost;
    `check()` between chunks of frames (it raises to interrupt)."""
    check_labels(*labels)
    psnr, ssim = psnr_and_ssim_per_frame(a, b, device, check)
    mean_psnr = math.inf if all(math.isinf(p) for p in psnr) else float(np.mean([min(p, 100.0) for p in psnr]))
    decoders = {}
    for label, s in zip(labels, stats.values()):
        decoders[label] = None if s is None else {
            "decoder": s.decoder, "seconds": round(s.seconds, 4), "peak_memory_gib": round(s.peak_memory_bytes / 2**30, 3),
            "processor": s.processor, "steps": s.steps, "tiles": s.tile_count, "tile_sizes": [list(t) for t in s.tile_sizes]}
    return {"frames": int(a.shape[0]), "size": [int(a.shape[2]), int(a.shape[1])],
            "psnr_mean_db": _finite(mean_psnr), "ssim_mean": float(np.mean(ssim)),
            "psnr_per_frame_db": [_finite(p) for p in psnr], "ssim_per_frame": ssim, "decoders": decoders}


def report_json(report: dict) -> str:
    return json.dumps(report, indent=2)
