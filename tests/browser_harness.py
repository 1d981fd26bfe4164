"""Helpers of the browser tier (tests/test_web_browser.py, tests/render_thumbnails.py): the tools it needs, and one
ComfyUI with the pack and the tiny set whose every template is opened, run and measured from headless chromium by
`web/tests/browser_templates.mjs`.

Needs `COMFYUI_PATH` (see tests/comfyui_harness.py), `/usr/bin/chromium` (`apt-get install chromium`) and `node`;
playwright-core is installed on first use with npm into `.cache/web-browser` (never inside web/: the frontend imports
every .js file there). No browser is downloaded.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import wave

import av
import numpy as np

import comfyui_harness as harness

CHROMIUM = "/usr/bin/chromium"
PLAYWRIGHT_CORE = "1.65.1"
PLAYWRIGHT_DIR = os.path.join(harness.PACK_ROOT, ".cache", "web-browser")
DRIVER = os.path.join(harness.PACK_ROOT, "web", "tests", "browser_templates.mjs")
# The page the templates are laid out for (nodes/tools/canvas_layout.py): a 1920×1080 screen.
VIEWPORT = (1920, 1080)
RUN_TIMEOUT_S = 300
# The templates are sized for real weights (768×512×121): the tiny set on CPU gets the small clip, and the guided
# nodes what the tiny transformer has (as the ComfyUI tier sends them).
TINY_WIDGETS = {"LTX25EmptyLatent": harness.SMALL_CLIP, **harness.TINY_GUIDED}
# The window of the extend template made as short as the tiny clip (as tests/test_guide_workflows.py runs it).
TINY_WIDGETS["LTX25ExtendClip"] = {"new_frames": 16}
# What a node shows after a run, by (a fragment of) its DOM widget's name: the frontend's video preview of a save,
# the pack's A/B viewer and decode figures (web/ltx25_ab_viewer.js).
GROWN = {"LTX25SaveVideo": "preview", "LTX25DecoderCompare": "ltx25_ab_viewer",
         "LTX25ConvVAEDecode": "ltx25_decode_stats", "LTX25DiffusionVAEDecode": "ltx25_decode_stats"}


class Unavailable(Exception):
    """A tool of the browser tier is missing here; the message says which and how to get it."""


def template_titles() -> list[str]:
    """The shipped UI templates, by the name the template browser shows (the file name without .json)."""
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(harness.PACK_ROOT, "workflows", "*.json")))


def template_classes(title: str) -> set[str]:
    workflow = harness.load_json(os.path.join(harness.PACK_ROOT, "workflows", f"{title}.json"))
    return {node["type"] for node in workflow["nodes"]}


def playwright_core() -> str:
    """The npm prefix holding playwright-core, installed there on first use."""
    if os.path.isfile(os.path.join(PLAYWRIGHT_DIR, "node_modules", "playwright-core", "package.json")):
        return PLAYWRIGHT_DIR
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not on PATH: it installs playwright-core for the browser test")
    # playwright-core carries no browser and downloads none on install; the test drives Debian's chromium
    done = subprocess.run([npm, "install", "--prefix", PLAYWRIGHT_DIR, "--no-audit", "--no-fund",
                           f"playwright-core@{PLAYWRIGHT_CORE}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise Unavailable(f"npm could not install playwright-core@{PLAYWRIGHT_CORE}: {done.stderr[-800:]}")
    return PLAYWRIGHT_DIR


def browser_tools() -> dict[str, str]:
    """chromium, node and playwright-core, or Unavailable naming the missing one (COMFYUI_PATH is checked by the
    caller: comfyui_harness.comfyui_path skips the test when it is unset)."""
    if not os.access(CHROMIUM, os.X_OK):
        raise Unavailable(f"{CHROMIUM} is missing: `apt-get install chromium` (Debian's build; no browser download)")
    node = shutil.which("node")
    if node is None:
        raise Unavailable("node is not on PATH: the browser test drives chromium from node (playwright-core)")
    return {"node": node, "playwright": playwright_core()}


def write_example_inputs(folder: str) -> None:
    """The files the conditioning templates' core Load Image / Load Audio / Load Video name
    (workflow_specs.EXAMPLE_FILES): two small gradients, the first of another aspect than the clip's, 0.6 s of a
    440 Hz tone (17 frames at 24 fps) and a 17-frame moving gradient at the clip's size (the IC-LoRA reference)."""
    from nodes.tools.workflow_specs import EXAMPLE_FILES
    os.makedirs(folder, exist_ok=True)
    for key, (height, width) in (("first", (70, 100)), ("last", (128, 192))):
        y, x = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
        rgb = np.stack([x, y, (x + y) / 2], -1).astype(np.uint8)
        with av.open(os.path.join(folder, EXAMPLE_FILES[key]), "w", format="image2") as container:
            stream = container.add_stream("png")
            stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
            container.mux(stream.encode())
    with av.open(os.path.join(folder, EXAMPLE_FILES["reference"]), "w") as container:  # 17 frames, the clip's size
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 192, 128, "yuv420p"
        y, x = np.meshgrid(np.linspace(0, 255, 128), np.linspace(0, 255, 192), indexing="ij")
        for i in range(17):
            rgb = np.stack([(x + 12 * i) % 256, y, (x + y) / 2], -1).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        container.mux(stream.encode())
    tone = (np.sin(np.arange(9600) / 16000 * 2 * np.pi * 440) * 9000).astype(np.int16)
    with wave.open(os.path.join(folder, EXAMPLE_FILES["audio"]), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(tone.tobytes())


def run_templates(work: str, titles: list[str], tools: dict[str, str], thumbnails: str = "") -> dict:
    """Start ComfyUI with the pack and the tiny set under `work`, open and run every template in `titles` from the
    page; the driver's findings (thumbnails written into `thumbnails` when given)."""
    from nodes.tools.tiny import write_tiny_set
    from nodes.tools.tiny.lora import write_tiny_dev_files
    models = harness.make_models_dir(work)
    write_tiny_set(models)
    write_tiny_dev_files(models)  # the dev template's transformer and distilled LoRA
    write_example_inputs(os.path.join(work, "base", "input"))  # ComfyUI's input folder under --base-directory
    server = harness.start_server(work)
    try:
        served = server.client.get("/workflow_templates").get(harness.PACK_FOLDER, [])
        missing = sorted(set(titles) - set(served))
        assert not missing, f"{missing} not served as templates; /workflow_templates: {served}"
        out = os.path.join(work, "screenshots")
        os.makedirs(out, exist_ok=True)
        cmd = [tools["node"], DRIVER, "--url", f"http://127.0.0.1:{server.port}/", "--pack", harness.PACK_FOLDER,
               "--templates", json.dumps(titles), "--playwright", tools["playwright"], "--out", out,
               "--chromium", CHROMIUM, "--timeout", str(RUN_TIMEOUT_S), "--viewport", "x".join(map(str, VIEWPORT)),
               "--widgets", json.dumps(TINY_WIDGETS), "--grown", json.dumps(GROWN), "--thumbnails", thumbnails]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S * (len(titles) + 1))
        lines = done.stdout.strip().splitlines()
        assert done.returncode == 0 and lines, f"driver failed ({done.returncode}): {done.stderr[-3000:]}"
        result = json.loads(lines[-1])
        if "error" in result:
            raise AssertionError(f"{result['error']}\n{json.dumps(result)[:3000]}\n{server.log_tail()}")
        result["out"], result["log_tail"] = out, server.log_tail()
        return result
    finally:
        server.stop()
