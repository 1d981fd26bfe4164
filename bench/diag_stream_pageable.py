"""The text encoder's way of streaming (`PIN_STREAMED = False`) on a CUDA device: blocks copied from the pageable
pages of a memory-mapped safetensors file, each page given back once its copy has returned. The CPU tests stream
onto the CPU; this runs the side-stream path on CUDA: the outputs equal the resident model's bit for bit over
several forwards, and the file's streamed pages are not the process's afterwards (the head's may be: at most one
block's worth is allowed). It cannot show when a page was given back: a file page dropped early reads back the same
bytes.

    python bench/diag_stream_pageable.py --out $OUT/stream_pageable.json   # CUDA
    python bench/diag_stream_pageable.py --device cpu --out /tmp/s.json    # the script itself
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodes.ltx import streaming  # noqa: E402

WIDTH, BLOCKS = 2048, 12  # 16 MiB a float32 block: many pages, copies long enough to overlap the next block


class Blocks(torch.nn.Module):
    PIN_STREAMED = False

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(BLOCKS)])

    def streamable_blocks(self) -> list[torch.nn.ModuleList]:
        return [self.blocks]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x)
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


def mapped_rss(path: str) -> int:
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and fields[-1] == real
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "blocks.safetensors")
    generator = torch.Generator().manual_seed(0)
    values = {k: torch.randn(v.shape, generator=generator) / WIDTH ** 0.5 for k, v in Blocks().state_dict().items()}
    save_file(values, path)
    descriptor = os.open(path, os.O_RDONLY)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)  # cold pages, as after a restart
    os.close(descriptor)

    reference = Blocks().to(device)
    reference.load_state_dict(values)
    x = torch.randn(256, WIDTH, generator=generator).to(device)
    with torch.no_grad():
        expected = reference(x)

    with torch.device("meta"):
        model = Blocks()
    with safe_open(path, framework="pt") as f:
        model.load_state_dict({k: f.get_tensor(k) for k in f.keys()}, assign=True)
    block_bytes = WIDTH * WIDTH * 4
    plan = streaming.place(model, device, int(3.5 * block_bytes))  # the head and two slots: every block streams
    streamer = streaming.streamer_of(model)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "streamed_blocks": streamer.streamed_count, "resident_blocks": len(plan.resident_indices),
              "pinned_streamer": streamer.pin, "forwards": []}
    with torch.no_grad():
        for _ in range(4):
            out = model(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            result["forwards"].append({"equal": bool(torch.equal(out, expected)),
                                       "max_abs_diff": float((out - expected).abs().max()),
                                       "file_rss_mib": round(mapped_rss(path) / 2 ** 20, 2)})
    result["file_mib"] = round(os.path.getsize(path) / 2 ** 20, 1)
    result["ok"] = all(f["equal"] for f in result["forwards"]) and result["streamed_blocks"] == BLOCKS \
        and not result["pinned_streamer"] and result["forwards"][-1]["file_rss_mib"] <= 1.05 * block_bytes / 2 ** 20
    print(json.dumps(result), flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    del model
    shutil.rmtree(folder, ignore_errors=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
