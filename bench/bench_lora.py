"""LoRAs merged into the weights vs applied on the fly, and the guided step's passes batched vs one by one: the dev
two-stage pipeline's two steps at the real 2.5 shapes, random bf16 weights, one GPU, one invocation.

    python bench/bench_lora.py --out bench_lora.json            # the 22B config on CUDA (< 3 min on an H200)
    python bench/bench_lora.py --smoke --out /tmp/smoke.json    # tiny config on the CPU, to check the script

The LoRA: rank `--rank` (450: `ltx-2.5-22b-distilled-lora-450`; its 8.90 GB in bf16 is about what rank 450 weighs
on the 1344 attention and feed-forward Linears of the 48 blocks, 8.67 GB) on every such Linear of both streams and
the cross-modal attentions, factors on the host as a file's are, strength 1, through the handles and the standalone
patcher exactly as the LoRA node applies it. Steps run as the samplers run them by default (CUDA graphs, `auto`):
1. dev stage-1 step, half size (video [1,128,16,8,12] + audio [1,8,126,16]), the reference's 2.5 guidance (cond,
   uncond, perturbed at block 28, isolated: 4 forwards), passes `sequential` and `batched`, for no LoRA, the LoRA on
   the fly and merged: median seconds per step, peak memory, and batched-vs-sequential x0 difference;
2. distilled stage-2 step, full size (video [1,128,16,16,24]), unguided (the dev pipeline's stage 2 with the
   distilled LoRA): none / on the fly / merged, and the on-the-fly-vs-merged x0 difference;
3. switching views: installing the on-the-fly factors (host → device) and removing them; merging (host backup of
   every merged weight + W += up@down) and restoring.
From these: the steps after which merging pays (`break_even_steps` = (merge + restore) / per-step on-the-fly cost).
Writes one JSON object to --out (and prints it).
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
from nodes.ltx.dit.accelerated_denoise import make_denoiser  # noqa: E402
from nodes.ltx.files.lora import LoraFactors  # noqa: E402
from nodes.tools.tiny.lora import TARGET_LEAVES  # noqa: E402
from nodes.tools.tiny.transformer import tiny_config_block  # noqa: E402

REAL = {"stage1": ((1, 128, 16, 8, 12), (1, 8, 126, 16)), "stage2": ((1, 128, 16, 16, 24), (1, 8, 126, 16))}
SMOKE = {"stage1": ((1, 128, 3, 2, 2), (1, 8, 5, 16)), "stage2": ((1, 128, 3, 4, 4), (1, 8, 5, 16))}
FPS, SIGMA = 24.0, 0.725


def relative(got, want) -> float:
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, want))


def lora_factors(model, device, rank: int, tokens: dict) -> tuple[dict, dict]:
    """Random factors (made on the device, kept on the host like a read file's) for every attention / FF Linear of
    the blocks, and the FLOPs they add per forward as a fraction of those Linears' own."""
    g = torch.Generator(device).manual_seed(2)
    factors, extra, own = {}, {"stage1": 0, "stage2": 0}, {"stage1": 0, "stage2": 0}
    for key, weight in model.state_dict().items():
        if not (key.startswith("dit.transformer_blocks.") and key.endswith(TARGET_LEAVES)):
            continue
        out_f, in_f = weight.shape
        up = torch.randn(out_f, rank, generator=g, device=device, dtype=torch.bfloat16) * 0.02
        down = torch.randn(rank, in_f, generator=g, device=device, dtype=torch.bfloat16) * 0.02
        factors[key] = LoraFactors(up.cpu(), down.cpu())
        for stage, (video_tokens, audio_tokens) in tokens.items():
            # a query side of the cross-modal attentions runs on the other stream's tokens; close enough for a ratio
            n = audio_tokens if ("audio_" in key.split(".")[3] or ".audio_ff." in key) else video_tokens
            extra[stage] += 2 * n * rank * (in_f + out_f)
            own[stage] += 2 * n * in_f * out_f
    return factors, {stage: extra[stage] / own[stage] for stage in extra}


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def peak_gib(device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def guided_step(module, guidance, inputs, device, runs: int, warmup: int) -> tuple[dict, dict]:
    out, x0 = {}, {}
    for batching in G.PASS_BATCHING:
        denoise = G.make_guided_denoiser(module, guidance, FPS, "auto", batching)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        x0[batching] = denoise(*inputs, SIGMA)
        out[batching] = {"s_per_step": round(median_seconds(lambda: denoise(*inputs, SIGMA), device, runs, warmup),
                                             4), "peak_gib": peak_gib(device)}
    out["batched_speedup"] = round(out["sequential"]["s_per_step"] / out["batched"]["s_per_step"], 3)
    out["batched_vs_sequential_rel"] = relative(x0["batched"], x0["sequential"])
    return out, x0


def plain_step(module, cond, inputs, device, runs: int, warmup: int) -> tuple[dict, tuple]:
    denoise = make_denoiser(module, cond, FPS, "auto")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    x0 = denoise(*inputs, SIGMA)
    seconds = median_seconds(lambda: denoise(*inputs, SIGMA), device, runs, warmup)
    return {"s_per_step": round(seconds, 4), "peak_gib": peak_gib(device)}, x0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--rank", type=int, default=450)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    block = tiny_config_block() if args.smoke else dict(T.SHIPPED_CONFIG)
    config = T.TransformerConfig.from_metadata("bench", {"config": {"transformer": block}})
    shapes = SMOKE if args.smoke else REAL
    rank = 4 if args.smoke else args.rank
    model = build(config, device, dtype)
    g = torch.Generator(device).manual_seed(1)
    conds = [Conditioning(torch.randn(1, 1024, config.cross_attention_dim, generator=g, device=device).to(dtype) * 0.1,
                          torch.randn(1, 1024, config.audio_cross_attention_dim, generator=g, device=device).to(dtype)
                          * 0.1) for _ in range(2)]
    inputs = {stage: tuple(torch.randn(s, generator=g, device=device) for s in pair) for stage, pair in shapes.items()}
    stg_block = config.num_layers - 1 if args.smoke else 28
    guidance = G.Guidance(conds[0], conds[1], G.ModalityGuidance(3.0, 1.0, (stg_block,), 0.7, 3.0),
                          G.ModalityGuidance(7.0, 1.0, (stg_block,), 0.7, 3.0))
    tokens = {stage: (v[2] * v[3] * v[4], a[2]) for stage, (v, a) in shapes.items()}
    factors, flops_fraction = lora_factors(model, device, rank, tokens)
    result = {"bench": "lora", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": str(dtype).split(".")[-1], "rank": rank,
              "lora_layers": len(factors), "lora_gib": round(sum(f.up.nbytes + f.down.nbytes for f in
                                                                 factors.values()) / 2**30, 3),
              "shapes": {s: [list(v), list(a)] for s, (v, a) in shapes.items()},
              "on_the_fly_extra_linear_flops": {s: round(f, 4) for s, f in flops_fraction.items()},
              "stage1_dev_guided": {}, "stage2_distilled": {}, "switching_s": {}}

    base = Loaded(model, bridge.make_patcher(model), None)
    views = {"none": base, "on_the_fly": base.with_weight_deltas(factors, 1.0, "on_the_fly"),
             "merged": base.with_weight_deltas(factors, 1.0, "merged")}
    base.ready()
    x0 = {}
    for name, view in views.items():
        if name != "none":
            result["switching_s"]["install" if name == "on_the_fly" else "merge"] = round(timed(view.ready, device), 3)
        module = view.ready()
        with torch.inference_mode():
            result["stage1_dev_guided"][name], _ = guided_step(module, guidance, inputs["stage1"], device, args.runs,
                                                               args.warmup)
            result["stage2_distilled"][name], x0[name] = plain_step(module, conds[0], inputs["stage2"], device,
                                                                    args.runs, args.warmup)
        if name != "none":
            result["switching_s"]["remove" if name == "on_the_fly" else "restore"] = round(timed(base.ready, device), 3)
    backup = sum(f.shape[0] * f.shape[1] for f in factors.values()) * torch.empty(0, dtype=dtype).element_size()
    result["merged_host_backup_gib"] = round(backup / 2**30, 2)  # the merged weights' originals
    result["stage2_distilled"]["on_the_fly_vs_merged_rel"] = relative(x0["on_the_fly"], x0["merged"])
    result["stage2_distilled"]["lora_vs_none_rel"] = relative(x0["merged"], x0["none"])
    # Merging pays once the per-step cost of the on-the-fly products exceeds what the merge and the restore cost
    # beyond installing and removing the factors.
    switching = result["switching_s"]
    cost = switching["merge"] + switching["restore"] - switching["install"] - switching["remove"]
    steps = {"stage1": (result["stage1_dev_guided"], "sequential"), "stage2": (result["stage2_distilled"], None)}
    result["break_even_steps"] = {}
    for stage, (entry, batching) in steps.items():
        pick = (lambda e: e[batching]["s_per_step"]) if batching else (lambda e: e["s_per_step"])  # noqa: E731
        extra = pick(entry["on_the_fly"]) - pick(entry["merged"])
        # 0: merging costs no more to switch; None: on the fly is no slower per step, merging never pays
        result["break_even_steps"][stage] = None if extra <= 0 else round(max(cost, 0.0) / extra, 1)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    text = json.dumps(result)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
