"""Run with ComfyUI's interpreter (tests/test_comfyui_lora.py does):

    COMFYUI_PYTHON tests/comfyui_lora_driver.py --comfyui ROOT --pack PACK_ROOT --transformer FILE --loras DIR \
        --report OUT.json

Inside a real ComfyUI: the tiny transformer handle gets two tiny LoRAs (kohya spelling with alpha, PEFT spelling)
through the pack's LoRA path, once merged (ComfyUI's own ModelPatcher applies its own LoRA adapters on load) and once
on the fly (the factors ride on the patcher as an attachment and are installed beside their layers after ComfyUI's
load). The report holds, per mode, the patch values' type, how far the result is from a merge by hand (the loaded
weights when merged, the x0 when on the fly), whether the weights were left alone (on the fly) and whether loading
the unpatched handle again restores every weight and the x0 bit for bit; and whether loading a plain view again
keeps the installed LoRA set (the empty one: the token its CUDA graphs are filed under), and that reloading a
model, or a clone of it, keeps what lives beside its weights (its release hook runs on unload only).
"""
from __future__ import annotations

import argparse
import json
import os

import comfyui_boot as boot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--comfyui", "--pack", "--transformer", "--loras", "--report"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    boot.comfy_flags(args.comfyui)
    import torch

    boot.import_pack(args.pack, "ltx25_pack")  # a package of its own name, as ComfyUI imports a custom node
    from ltx25_pack.nodes.comfy import bridge
    from ltx25_pack.nodes.comfy.handles import Loaded
    from ltx25_pack.nodes.ltx.conditioning import Conditioning
    from ltx25_pack.nodes.ltx.dit import transformer as T
    from ltx25_pack.nodes.ltx.files.assets import inspect_asset
    from ltx25_pack.nodes.ltx.files.lora import LoraTargets, read_lora
    from ltx25_pack.nodes.ltx.kernels import lora_linear
    from ltx25_pack.nodes.tools.tiny import lora as tiny_lora
    from ltx25_pack.nodes.tools.tiny.common import TINY_DIMS

    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g),
              Conditioning(torch.randn(1, 16, TINY_DIMS["video_inner"], generator=g),
                           torch.randn(1, 16, TINY_DIMS["audio_inner"], generator=g)))

    def x0(module):
        return T.denoise(module, *inputs[:2], 0.6, inputs[2], 24.0)

    def relative(got, want) -> float:
        return max((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(got, want))

    model = T.load_transformer(args.transformer, torch.float32)
    base = Loaded.register(model, inspect_asset(args.transformer))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    base_x0 = x0(base.ready())
    targets = LoraTargets.of(model, T.KEY_MAP)
    loras = (("kohya", 2, 0.7, 2.0), ("peft", 3, -0.4, None))  # style, seed, strength, alpha (rank 4)
    merged = dict(original)
    for style, seed, strength, alpha in loras:
        scale = 1.0 if alpha is None else alpha / 4
        for key, (up, down) in tiny_lora.tiny_lora_factors(seed, 4).items():
            merged[key] = merged[key] + strength * scale * (up @ down)
    by_hand = T.load_transformer(args.transformer, torch.float32)
    by_hand.load_state_dict(merged)
    want_x0 = x0(by_hand)

    report = {"comfy": bridge.HAS_COMFY}
    for apply in ("merged", "on_the_fly"):
        handle = base
        for style, seed, strength, alpha in loras:
            path = tiny_lora.write_tiny_lora(os.path.join(args.loras, f"{style}.safetensors"), style, seed, 4, alpha)
            handle = handle.with_weight_deltas(read_lora(path, targets), strength, apply)
        handle = handle.clone()  # ComfyUI clones carry the on-the-fly set (an attachment) along
        patches = [entry[1] for entries in handle.patcher.patches.values() for entry in entries]  # (strength, value…)
        got_x0 = x0(handle.ready())
        state = model.state_dict()
        entry = {"patch_types": sorted({type(p).__name__ for p in patches}),
                 "low_rank_layers": len(lora_linear.patched_layers(model)),
                 "x0_relative_diff": relative(got_x0, want_x0),
                 "weights_untouched": all(torch.equal(state[k], original[k]) for k in original)}
        if apply == "merged":
            entry["weights_relative_diff"] = max((state[k] - merged[k]).abs().max().item()
                                                 / merged[k].abs().max().item() for k in merged)
        again = x0(base.ready())
        entry["restored"] = all(torch.equal(t, original[k]) for k, t in model.state_dict().items()) and \
            all(torch.equal(a, b) for a, b in zip(again, base_x0)) and not lora_linear.patched_layers(model)
        report[apply] = entry
    report["lora_layers"] = len(tiny_lora.tiny_lora_factors(2, 4))
    token = lora_linear.token_of(model)
    base.clone().ready()
    report["plain_set_kept"] = lora_linear.token_of(model) == token  # its CUDA graphs stay valid
    released = []  # the release hook the transformer loader registers (CUDA graphs, parked factors, caches)
    probe = Loaded.register(T.load_transformer(args.transformer, torch.float32), inspect_asset(args.transformer),
                            on_unload=released.append)
    twin = probe.clone()
    for handle in (probe, probe, twin):  # load_models_gpu detaches each loaded clone, itself included, first
        handle.ready()
    report["released_on_reload"] = len(released)
    bridge.unload_model(twin.patcher)
    report["released_on_unload"] = len(released) - report["released_on_reload"]
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
