"""The main job on the tiny LTX-2.5 set: write the set (cached), run the decoder A/B workflow headless, print the
three mp4 paths and the JSON report (saved beside them under the run's counter, `decoder_ab_report_00001_.json`).

    python -m nodes.tools.demo --models .cache/tiny-models --out out
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

from ..comfy import bridge as comfy_bridge
from ..comfy import previews
from ..media import mp4
from . import tiny
from .run import execute, read_workflow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AB_WORKFLOW = os.path.join(ROOT, "workflows", "api", "ltx25_t2v_distilled_decoder_ab.json")
# The shipped graph is sized for real weights (768×512×121); the tiny set on 2 CPU cores gets a small clip.
DEMO_SIZE = {"5": {"width": 256, "height": 192, "frames": 25}}


def _writers_fingerprint() -> str:
    """The tiny set is rewritten whenever the engine or writer code changes."""
    digest = hashlib.sha256()
    for folder in (os.path.join(ROOT, "nodes", "ltx"), os.path.join(ROOT, "nodes", "tools", "tiny")):
        for parent, dirs, names in sorted(os.walk(folder)):
            dirs.sort()
            for name in sorted(n for n in names if n.endswith(".py")):
                with open(os.path.join(parent, name), "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:16]


def ensure_tiny_set(models_dir: str, seed: int = 0) -> None:
    stamp = os.path.join(models_dir, ".tiny-set")
    fingerprint = f"{_writers_fingerprint()} seed={seed}"
    paths = tiny.tiny_paths(models_dir)
    if os.path.exists(stamp) and open(stamp).read() == fingerprint and all(map(os.path.exists, paths.values())):
        print(f"[demo] tiny set cached in {models_dir}", file=sys.stderr)
        return
    print(f"[demo] writing the tiny LTX-2.5 set into {models_dir}", file=sys.stderr)
    tiny.write_tiny_set(models_dir, seed)
    with open(stamp, "w") as f:
        f.write(fingerprint)


def run_counter(videos: list[str]) -> int | None:
    """The counter a run's saves share (`LTX25SaveVideo`), read from their file names; None without one."""
    numbers = {mp4.counter_of(os.path.basename(path)) for path in videos}
    return numbers.pop() if len(numbers) == 1 else None


def write_report(out: str, text: str, counter: int | None) -> str:
    """The A/B report as `decoder_ab_report_<counter>_.json` in `out`: named with the run's videos, and never
    over an earlier run's report."""
    name = mp4.reserve(out, "decoder_ab_report", counter, ext="json", where="--out")
    with open(name.part, "w", encoding="utf-8") as f:
        f.write(text)
    return mp4.publish(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.tools.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=os.path.join(ROOT, ".cache", "tiny-models"))
    parser.add_argument("--out", default=os.path.join(ROOT, "out"))
    parser.add_argument("--workflow", default=AB_WORKFLOW)
    args = parser.parse_args(argv)
    ensure_tiny_set(args.models)
    comfy_bridge.set_models_dir(args.models)
    comfy_bridge.set_output_dir(args.out)
    prompt, workflow = read_workflow(args.workflow)
    for node_id, values in DEMO_SIZE.items():
        prompt[node_id]["inputs"].update(values)
    with previews.removed_afterwards():  # the A/B viewer's frames: no viewer here
        result = execute(prompt, extra_pnginfo={"workflow": workflow} if workflow is not None else None)
    videos = [result["outputs"][i][0] for i, node in prompt.items() if node["class_type"] == "LTX25SaveVideo"]
    reports = [text for ui in result["ui"].values() if "ltx25_report" in ui for text in ui["text"]]
    for path in videos:
        print(path)
    for text in reports:
        print(write_report(args.out, text, run_counter(videos)))
        report = json.loads(text)
        print(f"[demo] PSNR {report['psnr_mean_db']} dB, SSIM {report['ssim_mean']:.4f} between the decoders",
              file=sys.stderr)
    return 0 if videos and reports else 1


if __name__ == "__main__":
    raise SystemExit(main())
