"""An IC-LoRA reference's attention strength on the GPU (docs/MODEL.md §16.7): what the CPU tests cannot run — the
biased video self-attention in a CUDA graph (the bias a static input copied before each replay), compile modes
falling back for such a stage — and what the bias costs per step and in memory.

    python bench/bench_reference_attention.py --out reference_attention.json          # 22B config, random bf16
    python bench/bench_reference_attention.py --smoke --out reference_attention.json  # tiny config, CPU, eager only

Stage 1 of 768×512×121 at 24 fps ([1,128,16,8,12], audio [1,8,126,16]) with a reference at the clip's size
(spatial 1: 1536 + 1536 tokens) and at half size (spatial 2: 1536 + 384). Per reference size, per attention setting
(`strength_1`: no matrix; `strength_0.5`; `mask`: random weights in [0, 1], a quarter of them 0) and per acceleration
(eager, cuda_graph, compile_cuda_graph):
- `step_s`: median seconds of one denoiser call;
- `x0_max_diff_vs_eager`: max |x0 − eager x0| on the same inputs (cuda_graph: 0; compile_cuda_graph: 0 for the
  biased settings, which run cuda_graph's eager blocks; bf16 rounding at strength 1);
- `replay_with_strength_0.2_max_diff` (biased settings): the same graph replayed for a stage at strength 0.2, max
  |x0 − eager x0 of that stage| (0: the bias is copied in, not baked into the capture);
- `peak_gib`: peak allocated memory of the call sequence.
Writes one JSON object to `--out`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_transformer import FPS, build, median_seconds  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit import guides as G, transformer as T  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import make_denoiser, release  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block  # noqa: E402

REAL = ((1, 128, 16, 8, 12), (1, 8, 126, 16))
SMOKE = ((1, 128, 3, 4, 4), (1, 8, 5, 16))


def settings(tokens: int, device: torch.device) -> dict:
    g = torch.Generator(device).manual_seed(2)
    weights = torch.rand(tokens, generator=g, device=device)
    weights[torch.rand(tokens, generator=g, device=device) < 0.25] = 0.0
    return {"strength_1": (1.0, None), "strength_0.5": (0.5, None), "mask": (1.0, weights)}


def run(model, cond, video, audio, spatial: int, modes, device, runs: int, warmup: int) -> dict:
    b, c, f, h, w = video.shape
    g = torch.Generator(device).manual_seed(1)
    latent = torch.randn(1, c, f, h // spatial, w // spatial, generator=g, device=device)
    out = {}
    for name, (strength, mask) in settings(latent[0, 0].numel(), device).items():
        reference = lambda s: G.Guides(reference=(G.ReferenceGuide(latent, 1.0, spatial, 1, s, mask),))  # noqa: E731
        held = G.resolve(reference(strength), video, audio, FPS)
        again = G.resolve(reference(0.2), video, audio, FPS)
        v = held.extend(video)
        want = make_denoiser(model, cond, FPS, "eager", held)(v, audio, 0.725)
        row = {}
        for mode in modes:
            release(model)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            denoise = make_denoiser(model, cond, FPS, mode, held, notify=lambda line: None)
            got = denoise(v, audio, 0.725)
            entry = {"step_s": median_seconds(lambda: denoise(v, audio, 0.725), device, runs, warmup),
                     "x0_max_diff_vs_eager": max((x - y).abs().max().item() for x, y in zip(got, want))}
            if held.attention is not None:
                replayed = make_denoiser(model, cond, FPS, mode, again, notify=lambda line: None)(v, audio, 0.725)
                eager = make_denoiser(model, cond, FPS, "eager", again)(v, audio, 0.725)
                entry["replay_with_strength_0.2_max_diff"] = max((x - y).abs().max().item()
                                                                 for x, y in zip(replayed, eager))
            if device.type == "cuda":
                entry["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
            row[mode] = entry
        out[name] = row
    release(model)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    block = tiny_config_block() if args.smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    model = build(config, device, torch.float32 if args.smoke else torch.bfloat16)
    g = torch.Generator(device).manual_seed(3)
    cond = Conditioning(torch.randn(1, 1024, config.cross_attention_dim, generator=g, device=device),
                        torch.randn(1, 1024, config.audio_cross_attention_dim, generator=g, device=device))
    video_shape, audio_shape = SMOKE if args.smoke else REAL
    video = torch.randn(video_shape, generator=g, device=device)
    audio = torch.randn(audio_shape, generator=g, device=device)
    modes = ("eager",) if args.smoke else ("eager", "cuda_graph", "compile_cuda_graph")
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "video": video_shape, "audio": audio_shape}
    for spatial in (1, 2):
        result[f"spatial_{spatial}"] = run(model, cond, video, audio, spatial, modes, device, args.runs,
                                           args.warmup)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
