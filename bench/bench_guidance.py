"""The dev path's costs at the real shapes, random bf16 weights, one GPU: guided steps with the passes one by one or
batched, and a LoRA patched into the weights (merged) against its per-step cost if it were applied on the fly.

    python bench/bench_guidance.py            # the 22B config on CUDA (weights built on the GPU)
    python bench/bench_guidance.py --smoke    # tiny config on the CPU, to check the script

1. Guided stage-1 step (video [1,128,16,8,12] + audio [1,8,126,16], the reference's 2.5 guidance: cond, uncond,
   perturbed on block 28, isolated = 4 forwards) for `sequential` and `batched` pass batching, eager and CUDA graph:
   median seconds per step, peak memory, and max |x0_batched − x0_sequential| relative to the x0's scale.
2. LoRA of rank `--rank` (the distilled LoRA: 450) on every attention and feed-forward Linear of the DiT blocks:
   seconds to patch the shared module in place through the standalone patcher (backups included) and to restore
   it, and the FLOPs an on-the-fly LoRA (x·downᵀ·upᵀ per Linear) would add to each forward, as a fraction of the
   step's own. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_transformer import build, median_seconds, sync  # noqa: E402
from nodes.comfy import bridge  # noqa: E402
from nodes.comfy.handles import Loaded  # noqa: E402
from nodes.ltx.conditioning import Conditioning  # noqa: E402
from nodes.ltx.dit import guidance as G  # noqa: E402
from nodes.ltx.dit import transformer as T  # noqa: E402
from nodes.ltx.files.lora import LoraFactors  # noqa: E402
from nodes.tools.tiny.lora import TARGET_LEAVES  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block  # noqa: E402

REAL = ((1, 128, 16, 8, 12), (1, 8, 126, 16))
SMOKE = ((1, 128, 3, 2, 2), (1, 8, 5, 16))
FPS, SIGMA = 24.0, 0.8


def guided_steps(model, shapes, device, runs: int, warmup: int, stg_block: int) -> dict:
    g = torch.Generator(device).manual_seed(1)
    video, audio = (torch.randn(s, generator=g, device=device) for s in shapes)
    width_v, width_a = model.config.cross_attention_dim, model.config.audio_cross_attention_dim
    conds = [Conditioning(torch.randn(1, 1024, width_v, device=device, dtype=torch.bfloat16) * 0.1,
                          torch.randn(1, 1024, width_a, device=device, dtype=torch.bfloat16) * 0.1) for _ in range(2)]
    video_params = G.ModalityGuidance(3.0, 1.0, (stg_block,), 0.7, 3.0)
    audio_params = G.ModalityGuidance(7.0, 1.0, (stg_block,), 0.7, 3.0)
    guidance = G.Guidance(conds[0], conds[1], video_params, audio_params)
    out, x0 = {}, {}
    modes = ("eager", "cuda_graph") if device.type == "cuda" else ("eager",)
    for mode in modes:
        for batching in G.PASS_BATCHING:
            denoise = G.make_guided_denoiser(model, guidance, FPS, mode, batching)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            seconds = median_seconds(lambda: denoise(video, audio, SIGMA), device, runs, warmup)
            x0[(mode, batching)] = denoise(video, audio, SIGMA)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            out[f"{mode}/{batching}"] = {"s_per_step": seconds, "peak_gib": peak}
    for mode in modes:
        seq, bat = x0[(mode, "sequential")], x0[(mode, "batched")]
        out[f"{mode}/batched_vs_sequential_rel"] = max(((b - s).abs().max() / s.abs().max()).item()
                                                       for s, b in zip(seq, bat))
    return out


def lora_costs(model, device, rank: int, tokens: tuple[int, int]) -> dict:
    """Merge time through the standalone patcher, restore time, and an on-the-fly LoRA's extra FLOPs per forward."""
    g = torch.Generator(device).manual_seed(2)
    factors, lora_flops, base_flops = {}, 0, 0
    for key, weight in model.state_dict().items():
        if key.startswith("dit.transformer_blocks.") and key.endswith(TARGET_LEAVES):
            out_f, in_f = weight.shape
            n = tokens[1] if ".audio_" in key or "audio_ff" in key else tokens[0]
            factors[key] = LoraFactors(torch.randn(out_f, rank, generator=g, device=device, dtype=torch.bfloat16),
                                       torch.randn(rank, in_f, generator=g, device=device, dtype=torch.bfloat16)
                                       * 0.01)
            lora_flops += 2 * n * rank * (in_f + out_f)
            base_flops += 2 * n * in_f * out_f
    base = Loaded(model, bridge.make_patcher(model), None)
    patched = base.with_weight_deltas(factors, 1.0, "merged")
    base.ready()
    sync(device)
    start = time.perf_counter()
    patched.ready()
    sync(device)
    merge = time.perf_counter() - start
    start = time.perf_counter()
    base.ready()
    sync(device)
    restore = time.perf_counter() - start
    return {"rank": rank, "patched_weights": len(factors), "merge_s": merge, "restore_s": restore,
            "on_the_fly_extra_flops_fraction_of_patched_linears": lora_flops / base_flops}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rank", type=int, default=450)
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    block = tiny_config_block() if args.smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    model = build(config, device, torch.bfloat16)
    shapes = SMOKE if args.smoke else REAL
    stg_block = config.num_layers - 1 if args.smoke else 28
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "shapes": shapes, "guided": guided_steps(model, shapes, device, args.runs, args.warmup, stg_block)}
    video_tokens = shapes[0][2] * shapes[0][3] * shapes[0][4]
    result["lora"] = lora_costs(model, device, 4 if args.smoke else args.rank, (video_tokens, shapes[1][2]))
    print(json.dumps(result))



if __name__ == "__main__":
    main()
