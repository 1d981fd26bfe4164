"""The canvas extension in the real frontend: ComfyUI with the pack and the tiny set, the A/B template queued from
headless Debian chromium, then the viewer's elements, the wipe drag, the scrubber and the decoder panels checked.

Runs only when `COMFYUI_PATH` is set (see tests/comfyui_harness.py), `/usr/bin/chromium` exists
(`apt-get install chromium`) and `node` is on PATH; playwright-core is installed on first use with npm into
`.cache/web-browser` (never inside web/: the frontend imports every .js file there). No browser is downloaded.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

import pytest

import comfyui_harness as harness

CHROMIUM = "/usr/bin/chromium"
PLAYWRIGHT_CORE = "1.65.1"
PLAYWRIGHT_DIR = os.path.join(harness.PACK_ROOT, ".cache", "web-browser")
DRIVER = os.path.join(harness.PACK_ROOT, "web", "tests", "browser_ab_viewer.mjs")
# The pack folders ComfyUI serves as templates; the A/B one is named after the compare.
TEMPLATE_FOLDERS = ("example_workflows", "workflows")
AB_TEMPLATE = re.compile(r"(^|[_-])(ab|a_b|compare|decoder_compare)([_-]|$)", re.IGNORECASE)
RUN_TIMEOUT_S = 240


def ab_template() -> tuple[str, str]:
    """(template folder, name without .json) of the shipped A/B workflow, or skip when none is shipped yet."""
    for folder in TEMPLATE_FOLDERS:
        for path in sorted(glob.glob(os.path.join(harness.PACK_ROOT, folder, "*.json"))):
            name = os.path.splitext(os.path.basename(path))[0]
            if AB_TEMPLATE.search(name):
                return folder, name
    pytest.skip(f"no A/B template (a UI workflow named like *_ab* or *compare*) in {TEMPLATE_FOLDERS}")


def playwright_core() -> str:
    """The npm prefix holding playwright-core, installed there on first use; skip if npm cannot install it."""
    if os.path.isfile(os.path.join(PLAYWRIGHT_DIR, "node_modules", "playwright-core", "package.json")):
        return PLAYWRIGHT_DIR
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH: it installs playwright-core for the browser test")
    # playwright-core carries no browser and downloads none on install; the test drives Debian's chromium
    done = subprocess.run([npm, "install", "--prefix", PLAYWRIGHT_DIR, "--no-audit", "--no-fund",
                           f"playwright-core@{PLAYWRIGHT_CORE}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"npm could not install playwright-core@{PLAYWRIGHT_CORE}: {done.stderr[-800:]}")
    return PLAYWRIGHT_DIR


@pytest.fixture(scope="module")
def browser_tools() -> dict:
    """ComfyUI checkout, chromium, node and playwright-core, or a skip naming the missing one."""
    comfy_root = harness.comfyui_path()  # skips when COMFYUI_PATH is unset
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (Debian's build; no browser download)")
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the browser test drives chromium from node (playwright-core)")
    return {"comfy_root": comfy_root, "node": node, "playwright": playwright_core()}


@pytest.fixture(scope="module")
def ab_run(browser_tools, tmp_path_factory) -> dict:
    """Start ComfyUI with the pack and the tiny set, run the A/B template from the page; the driver's findings."""
    folder, name = ab_template()
    work = str(tmp_path_factory.mktemp("web_browser"))
    from nodes.tools.tiny import write_tiny_set
    write_tiny_set(harness.make_models_dir(work))
    server = harness.start_server(work)
    try:
        templates = server.client.get("/workflow_templates").get(harness.PACK_FOLDER, [])
        assert name in templates, f"{name} not served as a template; /workflow_templates: {templates}"
        out = os.path.join(work, "screenshots")
        os.makedirs(out)
        cmd = [browser_tools["node"], DRIVER, "--url", f"http://127.0.0.1:{server.port}/",
               "--workflow", f"/api/workflow_templates/{harness.PACK_FOLDER}/{name}.json",
               "--playwright", browser_tools["playwright"], "--out", out, "--chromium", CHROMIUM,
               "--timeout", str(RUN_TIMEOUT_S),
               # the template is sized for real weights (768×512×121): the tiny set on CPU gets the small clip
               "--empty-latent", json.dumps(harness.SMALL_CLIP)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 180)
        lines = done.stdout.strip().splitlines()
        assert done.returncode == 0 and lines, f"driver failed ({done.returncode}): {done.stderr[-3000:]}"
        result = json.loads(lines[-1])
        assert "error" not in result, f"{result['error']}\n{json.dumps(result)[:3000]}\n{server.log_tail()}"
        result["out"], result["template"] = out, f"{folder}/{name}"
        return result
    finally:
        server.stop()


def test_extension_loads_and_template_runs_from_the_page(ab_run):
    """The frontend imports web/ltx25_ab_viewer.js, every node of the template is known, and the run queued from
    the page succeeds. If this fails, the extension or the template is broken for a person opening ComfyUI."""
    assert ab_run["extension_loaded"], ab_run
    assert ab_run["missing_types"] == [], ab_run["missing_types"]
    assert ab_run["run"]["status"] == "success", ab_run["run"]
    # only errors raised in the pack's extension count: the frontend logs its own on a fresh user
    ours = [e for e in ab_run["page_errors"] if f"/extensions/{harness.PACK_FOLDER}/" in e]
    assert not ours, ours


def test_viewer_draws_frames_and_shows_the_report_table(ab_run):
    """After the run the compare node holds the viewer: frames painted on its canvas, and the table with PSNR,
    SSIM, time and peak memory. If this fails, the A/B shows nothing or no figures."""
    assert ab_run["before"]["painted_fraction"] > 0.2, ab_run["before"]
    labels = [row[0] for row in ab_run["table_rows"]]
    for label in ("PSNR, mean (B vs A)", "SSIM, mean (B vs A)", "time", "peak memory"):
        assert label in labels, f"{label!r} missing from {labels}"
    time_row = next(row for row in ab_run["table_rows"] if row[0] == "time")
    assert all(cell != "—" for cell in time_row[1:]), f"a decoder has no time: {time_row}"


def test_wipe_follows_the_drag(ab_run):
    """Dragging the wipe left then right moves the split and the handle with the pointer. If this fails, the
    viewer is a still picture and A/B cannot be judged."""
    before, left, right = ab_run["before"], ab_run["after_left"], ab_run["after_right"]
    assert left["split"] < before["split"] - 0.1, (before, left)
    assert left["handle_x"] < before["handle_x"] - 10, (before, left)
    assert right["split"] > before["split"] + 0.1, (before, right)
    assert right["handle_x"] > left["handle_x"] + 20, (left, right)
    assert os.path.getsize(os.path.join(ab_run["out"], "ab_viewer.png")) > 0


def test_scrubber_steps_to_the_next_frame(ab_run):
    """One ArrowRight on the scrubber shows frame 2 (when there is more than one frame). If this fails, only the
    first frame of the A/B can ever be seen."""
    if ab_run["scrub_max"] < 1:
        pytest.skip(f"the template decodes a single frame ({ab_run['before']['caption']})")
    assert ab_run["before"]["caption"].startswith("frame 1 /"), ab_run["before"]
    assert ab_run["after_scrub"]["caption"].startswith("frame 2 /"), ab_run["after_scrub"]


def test_decode_nodes_show_their_figures_and_their_path(ab_run):
    """Both decode nodes show the last run's time, peak memory, processor and tiles; each path has its own colour
    and badge; the panel stays out of the saved widget values. If this fails, the two decoder paths look alike
    or their costs are invisible."""
    by_class = {d["comfy_class"]: d for d in ab_run["decoders"]}
    assert set(by_class) == {"LTX25ConvVAEDecode", "LTX25DiffusionVAEDecode"}, list(by_class)
    for d in by_class.values():
        assert d["panel"] and all(k in d["panel"] for k in ("time", "peak memory", "processor", "tiles")), d
        assert not d["panel_serializes"], d
    conv, diffusion = by_class["LTX25ConvVAEDecode"], by_class["LTX25DiffusionVAEDecode"]
    assert conv["bgcolor"] != diffusion["bgcolor"], (conv, diffusion)
    assert "conv VAE" in conv["badges"] and "diffusion VAE" in diffusion["badges"], (conv, diffusion)
