"""Run with ComfyUI's interpreter (tests/test_comfyui_lora.py does):

    COMFYUI_PYTHON tests/comfyui_lora_driver.py --comfyui ROOT --pack PACK_ROOT --transformer FILE --loras DIR \
        --report OUT.json

Inside a real ComfyUI: the tiny transformer handle gets two tiny LoRAs (kohya spelling with alpha, PEFT spelling)
through the pack's LoRA path, so ComfyUI's own ModelPatcher applies its own LoRA adapters on load. The report holds
the patch values' type, the largest difference between the patched weights and a merge by hand, and whether
loading the unpatched handle again restores every weight bit for bit.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--comfyui", "--pack", "--transformer", "--loras", "--report"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.comfyui))
    import comfy.options  # noqa: F401  (argument parsing stays off: args hold the defaults)
    from comfy.cli_args import args as comfy_args
    comfy_args.cpu = True
    import torch

    # The pack as a package of its own name, as ComfyUI imports a custom node (its `nodes` stays inside it).
    spec = importlib.util.spec_from_file_location("ltx25_pack", os.path.join(args.pack, "__init__.py"),
                                                  submodule_search_locations=[args.pack])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["ltx25_pack"] = pack
    spec.loader.exec_module(pack)
    from ltx25_pack.nodes.comfy import bridge
    from ltx25_pack.nodes.comfy.handles import Loaded
    from ltx25_pack.nodes.ltx.dit import transformer as T
    from ltx25_pack.nodes.ltx.files.assets import inspect_asset
    from ltx25_pack.nodes.ltx.files.lora import LoraTargets, read_lora
    from ltx25_pack.nodes.tools.tiny import lora as tiny_lora

    model = T.load_transformer(args.transformer, torch.float32)
    base = Loaded.register(model, inspect_asset(args.transformer))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    targets = LoraTargets.of(model, T.KEY_MAP)
    loras = (("kohya", 2, 0.7, 2.0), ("peft", 3, -0.4, None))  # style, seed, strength, alpha (rank 4)
    handle, merged = base, dict(original)
    for style, seed, strength, alpha in loras:
        path = tiny_lora.write_tiny_lora(os.path.join(args.loras, f"{style}.safetensors"), style, seed, 4, alpha)
        handle = handle.with_weight_deltas(read_lora(path, targets), strength)
        scale = 1.0 if alpha is None else alpha / 4
        for key, (up, down) in tiny_lora.tiny_lora_factors(seed, 4).items():
            merged[key] = merged[key] + strength * scale * (up @ down)
    patches = [entry[1] for entries in handle.patcher.patches.values() for entry in entries]  # (strength, value, …)
    state = handle.ready().state_dict()
    diff = max((state[k] - merged[k]).abs().max().item() / merged[k].abs().max().item() for k in merged)
    base.ready()
    restored = all(torch.equal(t, original[k]) for k, t in model.state_dict().items())
    report = {"comfy": bridge.HAS_COMFY, "patch_types": sorted({type(p).__name__ for p in patches}),
              "max_relative_diff": diff, "restored": restored}
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
