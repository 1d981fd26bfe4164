"""The image-to-video graph (workflows/api/ltx25_i2v_distilled.json) end to end at 768×512×121 with real-shape RANDOM
weights: seconds and peak GPU memory per node, cold then warm — what the Image Guide's per-stage encodes (inside the
samplers' first moments) and the frame-0 conditioning add over the text-to-video A/B graph.

    python bench/bench_i2v_graph.py --out i2v.json            # CUDA, real shapes
    python bench/bench_i2v_graph.py --smoke --out smoke.json  # CPU, the tiny set at 192×128×17 (checks the script)

The modules are built as bench/bench_ab_graph.py builds them (its docstring says how); the video encoder (node 24) is
the released conv layout with random bf16 weights, registered under the conv VAE's official name. The image is a
1280×720 gradient with grain written to a temporary input folder and read by the headless Load Image stand-in
(nodes/tools/core_standins.py), so the guide's cover-and-crop and H.264 pre-compression run as in a real graph.
Writes one JSON object to --out: per node (cold, warm) seconds and peak GiB, and both runs' wall seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_ab_graph as ab  # noqa: E402
from nodes.comfy import bridge  # noqa: E402
from nodes.comfy.handles import Loaded  # noqa: E402
from nodes.ltx.encode import video_encoder as ve  # noqa: E402
from nodes.ltx.files.assets import Kind  # noqa: E402
from nodes.ltx.release import OFFICIAL_FILES, SHIPPED_CONV_VAE_CONFIG  # noqa: E402
from nodes.ltx.text import encoder as te  # noqa: E402
from nodes.tools import core_standins, workflow_specs  # noqa: E402
from nodes.tools.graph import validate  # noqa: E402
from nodes.tools.tiny import write_tiny_set  # noqa: E402

WORKFLOW = os.path.join(workflow_specs.ROOT, "workflows", "api", "ltx25_i2v_distilled.json")
LOADERS = {**ab.LOADERS, "24": "video_encoder"}


def _write_image(path: str, width: int = 1280, height: int = 720) -> None:
    import av
    rng = np.random.default_rng(0)
    y, x = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
    rgb = np.clip(np.stack([x, y, (x + y) / 2], -1) + rng.normal(0, 8, (height, width, 3)), 0, 255)
    with av.open(path, "w", format="image2") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24")))
        container.mux(stream.encode())


def _encoder(device: torch.device) -> Loaded:
    config = ve.VideoEncoderConfig.from_metadata("bench", {"config": {"vae": SHIPPED_CONV_VAE_CONFIG}}, nested=False)
    encoder = ve.VideoEncoder(config, "2.5.0")
    with torch.no_grad():
        for p in encoder.parameters():
            p.normal_(0, 0.02)
    return Loaded.register(encoder.to(device, torch.bfloat16).eval(), ab._info("conv_vae", Kind.CONV_VAE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, the tiny set through the loader nodes, 192×128×17")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    ab.NODE_CLASS_MAPPINGS = workflow_specs.CLASSES  # run_graph's classes: the pack's nodes and Load Image
    work = tempfile.mkdtemp(prefix="bench_i2v_graph_")
    os.makedirs(os.path.join(work, "input"))
    _write_image(os.path.join(work, "input", workflow_specs.EXAMPLE_FILES["first"]))
    core_standins.set_input_dir(os.path.join(work, "input"))
    bridge.set_models_dir(os.path.join(work, "models"))
    bridge.set_output_dir(os.path.join(work, "output"))
    write_tiny_set(os.path.join(work, "models"))
    with open(WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    width, height, frames = (192, 128, 17) if args.smoke else (768, 512, 121)
    prompt["5"]["inputs"].update(width=width, height=height, frames=frames)
    for node_id in ab.SAMPLERS:
        prompt[node_id]["inputs"]["acceleration"] = "eager" if args.smoke else "compile_cuda_graph"
    validate(prompt, workflow_specs.CLASSES)
    te.clear_caches()
    result: dict = {"bench": "i2v_graph", "shape": f"{width}x{height}x{frames}", "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if device.type == "cuda":
        tiny_text_encoder = os.path.join(work, "models", *OFFICIAL_FILES["text_encoder"])
        preset, result["build_s"], gemma = ab.build_real(device, tiny_text_encoder, "bf16")
        preset["24"] = (_encoder(device),)
        heavy = {LOADERS[k]: v[0].module for k, v in preset.items() if k != "2"}
        heavy["text_encoder"] = gemma
    else:
        _, outputs, _ = ab.run_graph(prompt, {}, device, {}, only=tuple(LOADERS))
        preset = {k: outputs[k] for k in LOADERS}
        heavy = {LOADERS[k]: v[0].module for k, v in preset.items() if k != "2"}
    return ab.cold_and_warm(prompt, preset, device, heavy, result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
