"""Where a truly cold A/B graph run spends its time, by Python function (cProfile over the first run of a fresh
process; the pack's cache folder pointed at an empty one). Per-node seconds, then, for each plain node over half a
second, the functions with the most cumulative time under its call (async nodes run beside others and are timed
only). The real-shape models are built in memory as `bench_ab_graph.py` builds them, Gemma kept on the card.

    python bench/diag_cold_profile.py --out $OUT/cold_profile.txt [--acceleration auto]
"""
from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import os
import pstats
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acceleration", default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    os.environ["LTX25_CACHE_DIR"] = tempfile.mkdtemp(prefix="ltx25_cold_")  # truly cold: nothing compiled yet
    os.environ["TRITON_CACHE_DIR"] = os.path.join(os.environ["LTX25_CACHE_DIR"], "triton")
    import torch
    import bench_ab_graph as ab
    from nodes.comfy import bridge
    from nodes.ltx.release import OFFICIAL_FILES
    from nodes.registry import NODE_CLASS_MAPPINGS
    from nodes.tools.run import execute
    from nodes.tools.tiny import write_tiny_set

    with open(ab.WORKFLOW, encoding="utf-8") as f:
        prompt = json.load(f)
    for node_id in ab.SAMPLERS:
        prompt[node_id]["inputs"]["acceleration"] = args.acceleration
    prompt["14"]["inputs"]["processor"] = "auto"
    work = tempfile.mkdtemp(prefix="diag_cold_")
    bridge.set_models_dir(os.path.join(work, "models"))
    bridge.set_output_dir(os.path.join(work, "output"))
    write_tiny_set(os.path.join(work, "models"))
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    preset, _, _ = ab.build_real(device, os.path.join(work, "models", *OFFICIAL_FILES["text_encoder"]),
                                 release_to_host=False)
    torch.cuda.synchronize()
    profiles, seconds = {}, {}

    classes = {k: NODE_CLASS_MAPPINGS[v["class_type"]] for k, v in prompt.items()}
    # async nodes (the saves, the audio decode, the compare) run as tasks beside later nodes, and only one profiler
    # may run at a time: those are timed only
    async_nodes = {k for k, c in classes.items() if inspect.iscoroutinefunction(getattr(c, c.FUNCTION))}

    def on_start(node_id: str) -> None:
        torch.cuda.synchronize()
        if node_id not in async_nodes:
            profiles[node_id] = cProfile.Profile()
            profiles[node_id].enable()

    def on_end(node_id: str, result, took: float) -> None:
        torch.cuda.synchronize()
        if node_id in profiles:
            profiles[node_id].disable()
        seconds[node_id] = took

    result = execute(prompt, NODE_CLASS_MAPPINGS, preset=preset, on_start=on_start, on_end=on_end)
    lines = [f"cold run {result['wall_s']:.2f} s, acceleration {args.acceleration}, torch {torch.__version__}"]
    for node_id, took in sorted(seconds.items(), key=lambda kv: -kv[1]):
        lines.append(f"\n===== {node_id} {prompt[node_id].get('_meta', {}).get('title', '')}: {took:.2f} s")
        if took < 0.5 or node_id not in profiles:
            continue
        text = io.StringIO()
        pstats.Stats(profiles[node_id], stream=text).sort_stats("cumulative").print_stats(args.top)
        lines.append(text.getvalue().split("\n", 6)[-1])
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines[:1] + [l for l in lines if l.startswith("\n=====")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
