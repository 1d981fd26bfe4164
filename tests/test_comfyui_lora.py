"""LoRAs inside a real ComfyUI (tests/comfyui_lora_driver.py, run with COMFYUI_PYTHON): the pack hands ComfyUI's
ModelPatcher ComfyUI's own LoRA adapters, whose patched weights equal a merge by hand, and the unpatched handle gets
every weight back bit for bit. Runs only when COMFYUI_PATH names a ComfyUI checkout; see docs/COMFYUI_TESTS.md."""
from __future__ import annotations

import json
import os
import subprocess

import comfyui_harness as h

pytestmark = h.requires_comfyui


def test_comfyui_applies_its_own_lora_adapters_as_a_hand_merge(tmp_path, transformer_path):
    """Two stacked LoRAs (kohya spelling with alpha 2 at 0.7, PEFT at −0.4) on the tiny transformer: the patch
    values are `comfy.weight_adapter.LoRAAdapter`s (never dense deltas), the weights ComfyUI loads equal
    W + Σ strength·alpha/rank·up@down, and loading the unpatched handle restores them exactly."""
    report_path = tmp_path / "report.json"
    cmd = [h.comfyui_python(), os.path.join(h.PACK_ROOT, "tests", "comfyui_lora_driver.py"),
           "--comfyui", h.comfyui_path(), "--pack", h.PACK_ROOT, "--transformer", transformer_path,
           "--loras", str(tmp_path), "--report", str(report_path)]
    result = subprocess.run(cmd, cwd=str(tmp_path), env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and report_path.exists(), (result.stdout + result.stderr)[-4000:]
    report = json.loads(report_path.read_text())
    assert report["comfy"] and report["patch_types"] == ["LoRAAdapter"], report
    assert report["max_relative_diff"] < 1e-6 and report["restored"], report
