"""GPU check: a diffusion decode's frames through `DeviceToHost` (out_device cpu) equal the same decode kept on the
device, bit for bit, untiled and tiled, batch 2."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_diffusion_vae import RELEASED_METADATA, build  # noqa: E402

from nodes.ltx import diffusion_vae as dv  # noqa: E402

vae = build(RELEASED_METADATA, torch.device("cuda"), torch.bfloat16)
latent = torch.randn(2, 128, 16, 8, 12, device="cuda", dtype=torch.bfloat16)
for mode, extra in (("off", {}), ("manual", {"tile_frames": 81, "tile_pixels": 256})):
    host, stats = dv.decode(vae, latent, processor="triton", tiling_mode=mode, out_device="cpu", **extra)
    device, _ = dv.decode(vae, latent, processor="triton", tiling_mode=mode, out_device="cuda", **extra)
    print(f"[check] {mode}: tiles {stats.tile_count}, frames {tuple(host.shape)}, "
          f"equal {torch.equal(host, device.cpu())}", flush=True)
