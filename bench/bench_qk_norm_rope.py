"""The DiT's fused query/key norm + split RoPE (nodes/ltx/kernels/qk_norm_rope.py) against diffusers' two steps, in
one process on the released config with random bf16 weights (issue 24: the default mode's element-wise third).

    python bench/bench_qk_norm_rope.py --out $OUT/qk_norm_rope.json                    # CUDA, < 5 minutes
    python bench/bench_qk_norm_rope.py --smoke --out /tmp/qk.json                      # CPU, tiny config (the script)

Per size (`--sizes`, default 768x512x121 and 1920x1088x121) and stage: the median step in `cuda_graph` mode (the
workflows' `auto`) and eager, with the fused processor (what the loader installs) and with diffusers' processor put
back on every attention, one after the other (the fused one first); the velocities' max and mean difference between the two relative to their
scale. And one video q at stage 2's token count alone: diffusers' RMSNorm + `apply_split_rotary_emb` against the
fused pass, with the bytes the fused pass must move (x read and written, cos and sin read) and the rate reached.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from diffusers.models.transformers.transformer_ltx2 import (LTX2Attention, LTX2AudioVideoAttnProcessor,  # noqa: E402
                                                            apply_split_rotary_emb)
from nodes.ltx.dit import attention  # noqa: E402
from nodes.ltx.dit.accelerated_denoise import drop_graphs, make_denoiser  # noqa: E402
from nodes.ltx.kernels import qk_norm_rope  # noqa: E402


def use(model, processor_cls) -> None:
    for module in model.dit.modules():
        if isinstance(module, LTX2Attention):
            module.set_processor(processor_cls())


def shapes_for(size: str) -> dict:
    w, h, f = (int(x) for x in size.split("x"))
    latent_f, audio_t = (f - 1) // 8 + 1, round(f / bt.FPS * 25) + 1
    return {"stage1": ((1, 128, latent_f, h // 64, w // 64), (1, 8, audio_t, 16)),
            "stage2": ((1, 128, latent_f, h // 32, w // 32), (1, 8, audio_t, 16))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="768x512x121,1920x1088x121")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, dtype, config, smoke_shapes = bt.stage_setup(args.smoke)
    model = bt.build(config, device, dtype)
    processors = {"fused": attention.FusedQKAttnProcessor, "diffusers": LTX2AudioVideoAttnProcessor}
    if args.smoke:  # the CPU: the kernel in Triton's interpreter
        qk_norm_rope.available = lambda x: True
    modes = ["cuda_graph", "eager"] if device.type == "cuda" else ["eager"]
    result = {"bench": "qk_norm_rope", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "runs": args.runs, "sizes": {}}
    for size in (["smoke"] if args.smoke else args.sizes.split(",")):
        shapes = smoke_shapes if args.smoke else shapes_for(size)
        cond, inputs = bt.random_inputs(config, shapes, device, dtype)
        entry = result["sizes"][size] = {}
        for stage, (video, audio) in inputs.items():
            row = entry[stage] = {"video": list(video.shape), "audio": list(audio.shape)}
            outputs = {}
            with torch.inference_mode():
                for mode in modes:
                    for name, cls in processors.items():
                        use(model, cls)
                        denoise = make_denoiser(model, cond, bt.FPS, mode)
                        row[f"{mode}_{name}_s"] = round(bt.median_seconds(
                            lambda: denoise(video, audio, 0.725), device, args.runs, 2), 4)
                        outputs[name] = [t.float().clone() for t in denoise(video, audio, 0.725)]
                        drop_graphs(model)
                    row[f"{mode}_saved_s"] = round(row[f"{mode}_diffusers_s"] - row[f"{mode}_fused_s"], 4)
                for i, stream in enumerate(("video", "audio")):
                    a, b = outputs["fused"][i], outputs["diffusers"][i]
                    scale = b.abs()
                    row[f"{stream}_x0_max_diff_over_max"] = float((a - b).abs().max() / scale.max())
                    row[f"{stream}_x0_mean_diff_over_mean"] = float((a - b).abs().mean() / scale.mean())
            print(json.dumps({size: {stage: row}}), flush=True)
        if not args.smoke:  # one video q of stage 2 alone
            video = shapes["stage2"][0]
            tokens = video[2] * video[3] * video[4]
            heads, half = config.heads, config.head_dim // 2
            x = torch.randn(1, tokens, heads * 2 * half, device=device, dtype=dtype)
            norm = model.dit.transformer_blocks[0].attn1.norm_q
            angles = torch.rand(1, heads, tokens, half, device=device) * 6
            freqs = (angles.cos(), angles.sin())
            with torch.inference_mode():
                unfused = bt.median_seconds(lambda: apply_split_rotary_emb(norm(x), freqs), device, 10, 3)
                fused = bt.median_seconds(lambda: qk_norm_rope.norm_split_rope(x, norm, freqs), device, 10, 3)
            moved = 2 * x.numel() * x.element_size() + 2 * angles.numel() * 4
            entry["q_alone"] = {"tokens": tokens, "diffusers_ms": round(unfused * 1e3, 3),
                                "fused_ms": round(fused * 1e3, 3), "fused_bytes": moved,
                                "fused_GBps": round(moved / fused / 1e9, 1)}
            print(json.dumps({size: {"q_alone": entry["q_alone"]}}), flush=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
