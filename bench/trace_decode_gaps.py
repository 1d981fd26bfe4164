"""Where a warm untiled 768×512×121 diffusion decode leaves the GPU idle: one decode under torch.profiler, the
union of kernel and copy intervals on the device against the wall span, and the longest idle gaps with the host
ops that ran during each (bench-only diagnosis).

    python bench/trace_decode_gaps.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_diffusion_vae import RELEASED_METADATA, build  # noqa: E402

from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest

vae = build(RELEASED_METADATA, torch.device("cuda"), torch.bfloat16)
latent = torch.randn(1, 128, 16, 16, 24, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    dv.decode(vae, latent, processor="auto", request=TilingRequest("off"))
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
    dv.decode(vae, latent, processor="auto", request=TilingRequest("off"))
    torch.cuda.synchronize()
events = prof.events()
device = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA)
host = [(e.time_range.start, e.time_range.end, e.name) for e in events
        if e.device_type == torch.autograd.DeviceType.CPU]
start = min(s for s, _, _ in host)
end = max(e for _, e, _ in host + device)
busy, gaps, cursor = 0.0, [], device[0][0]
for s, e, name in device:
    if s > cursor:
        gaps.append((s - cursor, cursor, name))
    busy += max(0.0, e - max(s, cursor))
    cursor = max(cursor, e)
print(f"[gaps] wall {(end - start) / 1e3:.1f} ms, device busy {busy / 1e3:.1f} ms, before first kernel "
      f"{(device[0][0] - start) / 1e3:.1f} ms, after last {(end - cursor) / 1e3:.1f} ms", flush=True)
for gap, at, nxt in sorted(gaps, reverse=True)[:15]:
    during = sorted({name for s, e, name in host if s < at + gap and e > at and e - s < 5 * gap + 1e3})[:6]
    print(f"[gap] {gap / 1e3:7.2f} ms at {(at - start) / 1e3:7.1f} ms before {nxt[:50]}; host: {during}", flush=True)
