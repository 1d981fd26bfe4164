"""The encoders at real shapes: the video encoder (the released 2.5 layout, random bf16 weights) on an image and on
clips, untiled and auto-tiled under a forced budget, and the audio encoder on 10 s of 48 kHz stereo — seconds and
peak device memory above the weights beside the pack's working-memory estimates (`working_memory`, which model
management is asked for and auto tiling plans with).

    python bench/bench_encode.py --out encode.json            # CUDA, real shapes
    python bench/bench_encode.py --smoke --out smoke.json     # CPU, tiny layout and shapes (checks the script runs)

Writes one JSON object to --out: per case the median seconds over --repeats runs, the peak bytes above the weights,
the estimate, their ratio (estimate / measured: ≥ 1 means the estimate is safe), and the tile count.
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
from nodes.ltx.audio_vae import AudioVAEConfig  # noqa: E402
from nodes.ltx.decode.tiling import TilingRequest  # noqa: E402
from nodes.ltx.device_memory import weight_bytes  # noqa: E402
from nodes.ltx.encode import audio_encoder as ae  # noqa: E402
from nodes.ltx.encode import video_encoder as ve  # noqa: E402
from nodes.ltx.release import SHIPPED_CONV_VAE_CONFIG  # noqa: E402
from nodes.tools.tiny.audio_vae import TINY_AUDIO_VAE_CONFIG  # noqa: E402
from nodes.tools.tiny.conv_vae import TINY_VAE_CONFIG  # noqa: E402

# (frames, height, width); the last one also auto-tiled under a budget of a quarter of its untiled estimate
REAL_VIDEO = {"image 768x512": (1, 512, 768), "768x512x121": (121, 512, 768), "1920x1088x121": (121, 1088, 1920)}
SMOKE_VIDEO = {"image 96x64": (1, 64, 96), "96x64x17": (17, 64, 96)}
# the shipped audio VAE config (§11): width 128, ×(1, 2, 4), two resnets per level
REAL_AUDIO = {"model": {"params": {"ddconfig": {
    "double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256, "in_channels": 2, "out_ch": 2, "ch": 128,
    "ch_mult": [1, 2, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0,
    "mid_block_add_attention": False, "norm_type": "pixel", "causality_axis": "height"}, "sampling_rate": 16000}},
    "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160, "causal": True},
                      "mel": {"n_mel_channels": 64}}}


def _random_(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.02)
    return module


def _measure(device: torch.device, repeats: int, run) -> tuple[float, int]:
    """(median seconds, peak bytes allocated above what was allocated before) of `run()`."""
    times, peak = [], 0
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    vae = TINY_VAE_CONFIG if args.smoke else SHIPPED_CONV_VAE_CONFIG
    config = ve.VideoEncoderConfig.from_metadata("bench", {"config": {"vae": vae}}, nested=False)
    encoder = _random_(ve.VideoEncoder(config, "2.5.0")).to(device, dtype).eval()
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "dtype": str(dtype), "weights_bytes": weight_bytes(encoder), "video": {},
               "audio": {}}
    shapes = SMOKE_VIDEO if args.smoke else REAL_VIDEO
    for name, (frames, height, width) in shapes.items():
        pixels = torch.rand(1, frames, height, width, 3)
        estimate = ve.working_memory(encoder, tuple(pixels.shape))
        requests = {"untiled": (TilingRequest("off"), None)}
        if name == list(shapes)[-1]:
            requests["auto, budget estimate/4"] = (TilingRequest("auto"), estimate // 4)
        for label, (request, budget) in requests.items():
            plan = ve.encode_plan(encoder, tuple(pixels.shape), request, budget)
            seconds, peak = _measure(device, args.repeats,
                                     lambda: ve.encode_video(encoder, pixels, request, free_memory=budget or 0))
            row = {"seconds": round(seconds, 4), "peak_bytes": peak, "estimate_bytes": plan.estimate_bytes,
                   "estimate_over_peak": round(plan.estimate_bytes / peak, 3) if peak else None,
                   "tiles": plan.count, "plan": plan.reason}
            results["video"][f"{name} {label}"] = row
            print(json.dumps({name: row}), file=sys.stderr, flush=True)
    audio_config = TINY_AUDIO_VAE_CONFIG if args.smoke else REAL_AUDIO
    metadata = {"config": {"audio_vae": audio_config}}
    audio = _random_(ae.AudioEncoder(AudioVAEConfig.from_metadata("bench", metadata), 1024)).to(device, dtype)
    waveform = torch.randn(1, 2, 48000 * (2 if args.smoke else 10)) * 0.3
    estimate = ae.working_memory(audio, tuple(waveform.shape), 48000)
    seconds, peak = _measure(device, args.repeats, lambda: ae.encode_audio(audio, waveform, 48000))
    results["audio"]["48kHz stereo"] = {"samples": waveform.shape[-1], "seconds": round(seconds, 4),
                                        "peak_bytes": peak, "estimate_bytes": estimate,
                                        "estimate_over_peak": round(estimate / peak, 3) if peak else None}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
