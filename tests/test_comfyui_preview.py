"""Live previews inside a real ComfyUI (tests/comfyui_preview_driver.py, run with COMFYUI_PYTHON): the bridge's
preview callback sends each step's x0 video latent through ComfyUI's own previewer and progress bar, as core's LTX-2
samplers do, and sends none when the user's preview method is off. Runs only when COMFYUI_PATH names a ComfyUI
checkout; see docs/COMFYUI_TESTS.md."""
from __future__ import annotations

import json
import os
import subprocess

import comfyui_harness as h

pytestmark = h.requires_comfyui


def test_comfyui_progress_bar_gets_a_latent2rgb_preview_per_step(tmp_path):
    """With Latent2RGB, every step reaches ComfyUI's progress hook with its value, the total and a JPEG preview of
    the first latent frame (W×H = 6×4 for a 4×6 latent) whose pixels are core's LTX-2 factors applied to x0 (within
    one 8-bit level); with previews off the steps arrive without an image."""
    report_path = tmp_path / "report.json"
    cmd = [h.comfyui_python(), os.path.join(h.PACK_ROOT, "tests", "comfyui_preview_driver.py"),
           "--comfyui", h.comfyui_path(), "--pack", h.PACK_ROOT, "--report", str(report_path)]
    result = subprocess.run(cmd, cwd=str(tmp_path), env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and report_path.exists(), (result.stdout + result.stderr)[-4000:]
    report = json.loads(report_path.read_text())
    assert report["comfy"], report
    previews = report["runs"]["Latent2RGB"]
    assert [(s["value"], s["total"], s["preview"]) for s in previews] == [(i, 3, True) for i in (1, 2, 3)], report
    assert all(s["format"] == "JPEG" and s["size"] == [6, 4] and s["mode"] == "RGB" for s in previews), report
    assert all(s["max_pixel_diff"] <= 1 for s in previews), report
    plain = report["runs"]["NoPreviews"]  # ComfyUI's throttle may hold back a plain update, never the first or last
    assert not any(s["preview"] for s in plain), report
    assert (plain[0]["value"], plain[-1]["value"], plain[-1]["total"]) == (1, 3, 3), report
