"""Guided (conditioned) sampling on the GPU: what the CPU tests cannot run — the CUDA-graph and compiled denoisers
with per-token timesteps, positions and keyframe marks as graph inputs — and what conditioning costs per step.

    python bench/bench_guides.py --out guides.json           # the 22B config, random bf16 weights, one CUDA GPU
    python bench/bench_guides.py --smoke --out guides.json   # tiny config on the CPU (eager only), to check the script

768×512×121 at 24 fps (stage 1 [1,128,16,8,12], stage 2 [1,128,16,16,24], audio [1,8,126,16]). Per stage and per
acceleration (eager, cuda_graph, compile_cuda_graph), for three conditionings — t2v (no guides), i2v + last frame
(frame 0 replaced, frame 120 appended) and a2v (the whole audio held):
- `step_s`: median seconds of one denoiser call;
- `x0_max_diff_vs_eager`: max |x0 − eager x0| on the same inputs (cuda_graph must be 0; compile: bf16 rounding);
- `replay_after_moving_the_guide`: the same graph with the appended guide at frame 60 instead of 120 and another σ,
  max |x0 − eager x0| (0 for cuda_graph: positions and timesteps are graph inputs, not baked in);
- `held_exact`: a 3-step `sample_distilled` run keeps the frame-0 guide / the audio bit for bit.
Writes one JSON object to `--out`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_transformer import FPS, REAL_SHAPES, SMOKE_SHAPES, build, median_seconds  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit import guides as G, sampling, transformer as T  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import make_denoiser, release  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block  # noqa: E402


def conditionings(video_shape, audio_shape, device, appended_frame: int) -> dict[str, G.Guides | None]:
    g = torch.Generator(device).manual_seed(1)
    b, c, f, h, w = video_shape
    image = lambda: torch.randn(1, c, 1, h, w, generator=g, device=device)  # noqa: E731
    return {"t2v": None,
            "i2v_last_frame": G.Guides((G.VideoGuide(image(), 0), G.VideoGuide(image(), appended_frame))),
            "a2v": G.Guides(audio=(G.AudioGuide(torch.randn(audio_shape, generator=g, device=device)),))}


def run_stage(model, cond, video_shape, audio_shape, modes, device, runs, warmup) -> dict:
    out = {}
    last = G.latent_span(video_shape[2] - 1)[1]
    g = torch.Generator(device).manual_seed(0)
    video = torch.randn(video_shape, generator=g, device=device)
    audio = torch.randn(audio_shape, generator=g, device=device)
    moved = conditionings(video_shape, audio_shape, device, last // 2)["i2v_last_frame"]
    for name, guides in conditionings(video_shape, audio_shape, device, last).items():
        held = G.resolve(guides, video, audio, FPS)
        v = video if held is None else held.extend(video)
        eager = make_denoiser(model, cond, FPS, "eager", held)
        want = eager(v, audio, 0.725)
        row = {}
        for mode in modes:
            release(model)
            denoise = make_denoiser(model, cond, FPS, mode, held)
            got = denoise(v, audio, 0.725)
            entry = {"step_s": median_seconds(lambda: denoise(v, audio, 0.725), device, runs, warmup),
                     "x0_max_diff_vs_eager": max((a - b).abs().max().item() for a, b in zip(got, want))}
            if name == "i2v_last_frame":
                held2 = G.resolve(moved, video, audio, FPS)
                got2 = make_denoiser(model, cond, FPS, mode, held2)(v, audio, 0.421875)
                want2 = make_denoiser(model, cond, FPS, "eager", held2)(v, audio, 0.421875)
                entry["replay_after_moving_the_guide"] = max((a - b).abs().max().item()
                                                             for a, b in zip(got2, want2))
            if guides is not None:
                sampled = sampling.sample_distilled(model, cond, video, audio, fps=FPS, seed=0, stage=2,
                                                    sigmas=sampling.STAGE2_SIGMAS, acceleration=mode, guides=guides)
                entry["held_exact"] = bool(torch.equal(sampled[1], held.audio_clean)) if name == "a2v" else \
                    bool(torch.equal(sampled[0][:, :, 0], held.video_clean[:, :, 0]))
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
    dims = (config.cross_attention_dim, config.audio_cross_attention_dim)
    g = torch.Generator(device).manual_seed(3)
    cond = Conditioning(torch.randn(1, 1024, dims[0], generator=g, device=device),
                        torch.randn(1, 1024, dims[1], generator=g, device=device))
    modes = ("eager",) if args.smoke else ("eager", "cuda_graph", "compile_cuda_graph")
    shapes = SMOKE_SHAPES if args.smoke else REAL_SHAPES
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "shapes": shapes}
    for stage, (video_shape, audio_shape) in shapes.items():
        result[stage] = run_stage(model, cond, video_shape, audio_shape, modes, device, args.runs, args.warmup)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
