"""Whether one warm-up forward before a CUDA-graph capture is enough (`accelerated_denoise.WARMUP_CALLS`): per mode
(`cuda_graph`, `compile_cuda_graph`) and stage, the first call's seconds (warm-ups + capture + replay) and the
replayed output with 2 warm-ups and with 1, on one model in one process; the outputs must be equal bit for bit.

    python bench/diag_warmup_calls.py --out $OUT/warmup_calls.json   # CUDA, released config, random bf16 weights
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_transformer as bt  # noqa: E402
from nodes.ltx.dit import accelerated_denoise as A  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, dtype, config, shapes = bt.stage_setup(False)
    model = bt.build(config, device, dtype)
    cond, inputs = bt.random_inputs(config, shapes, device, dtype)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    with torch.inference_mode():
        for mode in ("cuda_graph", "compile_cuda_graph"):
            for stage, (video, audio) in inputs.items():
                outputs = {}
                for warmups in (2, 1):
                    A.WARMUP_CALLS = warmups
                    A.drop_graphs(model)
                    denoise = A.make_denoiser(model, cond, bt.FPS, mode)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    out = denoise(video, audio, 0.725)
                    torch.cuda.synchronize()
                    first = time.perf_counter() - start
                    replay = bt.median_seconds(lambda: denoise(video, audio, 0.725), device, 3, 0)
                    outputs[warmups] = [t.float().clone() for t in denoise(video, audio, 0.725)]
                    row = {"mode": mode, "stage": stage, "warmups": warmups, "first_call_s": round(first, 3),
                           "replay_s": round(replay, 4)}
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
                equal = all(torch.equal(a, b) for a, b in zip(outputs[2], outputs[1]))
                result["rows"].append({"mode": mode, "stage": stage, "outputs_equal_bitwise": equal})
                print(json.dumps(result["rows"][-1]), flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
