"""The dev two-stage graph (workflows/api/ltx25_t2v_dev_two_stage.json) end to end at 768×512×121 with real-shape
RANDOM weights: stage 1 on the dev transformer with the reference's 2.5 guidance (30 Euler steps, CFG + STG +
modality guidance: four passes a step), the upsampler, stage 2 with the distilled LoRA on the fly, both decoders —
seconds and peak GPU memory per node, cold then warm.

    python bench/bench_dev_graph.py --out dev.json            # CUDA, real shapes (a few minutes on an H200)
    python bench/bench_dev_graph.py --smoke --out smoke.json  # CPU, the tiny set at 192×128×17 (checks the script)

Modules are built as bench/bench_ab_graph.py builds them (its docstring says how); the dev transformer is the
distilled one's layout (the files differ only in their values). The distilled LoRA (rank 450 on every attention and
feed-forward Linear of the blocks, as bench/bench_lora.py makes it, factors in host memory as a read file's) is put on
the transformer handle the way the LoRA node puts a read file (`Loaded.with_weight_deltas`), standing in for node 23's
output: an 8.9 GB file is not written to the GPU machine's disk. `--pass-batching batched` runs the four passes as
one forward. Writes one JSON object to --out: per node (cold, warm) seconds, peak GiB and the engine's counts (CUDA
graphs captured, their warm-up forwards, LoRA layers whose factors were copied to the device or taken back from the
set parked beside the model), both runs' wall seconds, and `warm_samplers`: the two samplers' warm rows. Warm, the
samplers should capture nothing and copy no factor (stage 2 takes its 1344 layers' factors back): the model switches
between the plain view and the LoRA view every run, and each view's graphs and factors are kept. (`--smoke` runs
eagerly, so it captures nothing, and runs the LoRA node in each run: a new set, its factors copied again.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_ab_graph as ab  # noqa: E402
from nodes.comfy import bridge  # noqa: E402
from nodes.ltx.release import OFFICIAL_FILES  # noqa: E402
from nodes.ltx.text import encoder as te  # noqa: E402
from nodes.tools import workflow_specs  # noqa: E402
from nodes.tools.graph import validate  # noqa: E402
from nodes.tools.tiny import write_tiny_set  # noqa: E402
from nodes.tools.tiny.lora import write_tiny_dev_files  # noqa: E402

WORKFLOW = os.path.join(workflow_specs.ROOT, "workflows", "api", "ltx25_t2v_dev_two_stage.json")
SAMPLERS = ("10", "12")
LORA_NODE = "23"
LORA_RANK = 450


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, the tiny set through the loader nodes, 192×128×17")
    parser.add_argument("--pass-batching", choices=("sequential", "batched"), default="sequential")
    parser.add_argument("--steps", type=int, default=0, help="stage-1 steps (default: the template's)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    work = tempfile.mkdtemp(prefix="bench_dev_graph_")
    models = os.path.join(work, "models")
    bridge.set_models_dir(models)
    bridge.set_output_dir(os.path.join(work, "output"))
    write_tiny_set(models)
    write_tiny_dev_files(models)  # the names the template validates against
    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    width, height, frames = (192, 128, 17) if args.smoke else (768, 512, 121)
    prompt["5"]["inputs"].update(width=width, height=height, frames=frames)
    if args.smoke:  # the tiny transformer has 2 blocks, not the 48 whose 29th the reference perturbs
        prompt["22"]["inputs"].update(video_stg_blocks="1", audio_stg_blocks="1")
    prompt["10"]["inputs"]["pass_batching"] = args.pass_batching
    if args.steps:
        prompt["10"]["inputs"]["steps"] = args.steps
    for node_id in SAMPLERS:
        prompt[node_id]["inputs"]["acceleration"] = "eager" if args.smoke else "auto"
    validate(prompt, ab.NODE_CLASS_MAPPINGS)
    te.clear_caches()
    result: dict = {"bench": "dev_graph", "shape": f"{width}x{height}x{frames}", "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "stage1_steps": prompt["10"]["inputs"]["steps"], "pass_batching": args.pass_batching}
    if device.type == "cuda":
        from bench_lora import lora_factors
        torch.backends.cudnn.benchmark = True
        tiny_text_encoder = os.path.join(models, *OFFICIAL_FILES["text_encoder"])
        preset, result["build_s"], gemma = ab.build_real(device, tiny_text_encoder, "bf16")
        transformer = preset["1"][0]
        tokens = {"stage1": (1536, 126), "stage2": (6144, 126)}  # only for the FLOPs ratio it also returns
        factors, _ = lora_factors(transformer.module, device, LORA_RANK, tokens)
        preset[LORA_NODE] = (transformer.with_weight_deltas(factors, 1.0, "auto"),)
        heavy = {ab.LOADERS[k]: v[0].module for k, v in preset.items() if k in ab.LOADERS and k != "2"}
        heavy["text_encoder"] = gemma
    else:
        _, outputs, _ = ab.run_graph(prompt, {}, device, {}, only=tuple(ab.LOADERS))
        preset = {k: outputs[k] for k in ab.LOADERS}
        heavy = {ab.LOADERS[k]: v[0].module for k, v in preset.items() if k != "2"}
    code = ab.cold_and_warm(prompt, preset, device, heavy, result, args.out)
    result["warm_samplers"] = {node_id: result["warm"][node_id] for node_id in SAMPLERS}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["warm_samplers"]))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
