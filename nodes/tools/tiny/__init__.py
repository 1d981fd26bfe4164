"""Write the tiny LTX-2.5 split set into a ComfyUI-style models folder.

    python -m nodes.tools.tiny OUT_DIR [--seed N]

Six files with the official names, tiny sizes and the exact native format; the pack's loaders load them exactly
as they load the released files. Each component has its writer module here (`write_tiny(path, seed)`).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from ...ltx.release import OFFICIAL_FILES


def tiny_paths(out_dir: str) -> dict[str, str]:
    return {component: os.path.join(out_dir, folder, name) for component, (folder, name) in OFFICIAL_FILES.items()}


# component → its writer module in this package (imported on use: each pulls in its engine module and diffusers)
WRITERS = {component: f".{component}" for component in OFFICIAL_FILES}


def write_tiny(component: str, path: str, seed: int = 0) -> str:
    """Write one tiny file (`component` as in OFFICIAL_FILES) to `path`."""
    return importlib.import_module(WRITERS[component], __package__).write_tiny(path, seed)


def write_tiny_set(out_dir: str, seed: int = 0) -> dict[str, str]:
    """Write all six files; returns component → path."""
    paths = tiny_paths(out_dir)
    for component, path in paths.items():
        write_tiny(component, path, seed)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.tools.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    paths = write_tiny_set(args.out_dir, args.seed)
    total = sum(os.path.getsize(p) for p in paths.values())
    for component, path in paths.items():
        print(f"{component:14s} {os.path.getsize(path) / 2**20:7.2f} MiB  {path}")
    print(f"tiny LTX-2.5 set: {total / 2**20:.1f} MiB in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
