"""The two decoders of the A/B on the same 768×512×121 latent, interleaved round by round in one process (so drift
and the machine hit both alike): our diffusion decode (untiled, `auto` processor) and our conv decode (auto
tiling). Prints each round and the medians, and the
ratio diffusion / conv. Also checks that frames through the host staging equal frames kept on the device.

    python bench/bench_decoder_ratio.py --rounds 7
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_conv_vae import build as build_conv  # noqa: E402
from bench_diffusion_vae import RELEASED_METADATA, build  # noqa: E402

from nodes.ltx.decode import conv_vae as cv
from nodes.ltx.decode import diffusion_vae as dv
from nodes.ltx.decode.tiling import TilingRequest
from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG


def seconds(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    vae = build(RELEASED_METADATA, device, dtype)
    small = torch.randn(2, 128, 16, 8, 12, device=device, dtype=dtype)
    for mode, extra in (("off", {}), ("auto", {"free_memory": 1 << 30})):
        try:
            request = TilingRequest(mode)
            host, stats = dv.decode(vae, small, processor="auto", request=request, out_device="cpu", **extra)
            kept, _ = dv.decode(vae, small, processor="auto", request=request, out_device="cuda", **extra)
            print(f"[check] {mode}: {stats.tile_count} tiles, frames {tuple(host.shape)}, "
                  f"equal to the device's: {torch.equal(host, kept.cpu())}", flush=True)
        except Exception as error:  # noqa: BLE001 - the timing below still runs
            print(f"[check] {mode}: failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
    _ref, conv = build_conv(SHIPPED_CONV_VAE_CONFIG, device, dtype)
    latent = torch.randn(1, 128, 16, 16, 24, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    cases = {"diffusion": lambda: dv.decode(vae, latent, processor="auto", request=TilingRequest("off")),
             "conv": lambda: cv.decode_conv(conv, latent)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.rounds + 1):  # round 0 warms up (compiles)
        for name, fn in cases.items():
            took = seconds(fn)
            if round_:
                times[name].append(took)
        if round_:
            print(f"[round] {round_}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print("[ratio] " + json.dumps({"gpu": torch.cuda.get_device_name(), "median_s": medians,
                                   "diffusion_over_conv": round(medians["diffusion"] / medians["conv"], 3)}),
          flush=True)


if __name__ == "__main__":
    main()
