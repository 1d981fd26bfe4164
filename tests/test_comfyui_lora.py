"""LoRAs inside a real ComfyUI (tests/comfyui_lora_driver.py, run with COMFYUI_PYTHON): merged, the pack hands
ComfyUI's ModelPatcher ComfyUI's own LoRA adapters, whose patched weights equal a merge by hand; on the fly, the
factors ride on the patcher as an attachment, the weights stay untouched and the x0 equals the hand-merged model's;
either way the unpatched handle gets every weight back bit for bit. Runs only when COMFYUI_PATH names a ComfyUI
checkout; see docs/COMFYUI_TESTS.md."""
from __future__ import annotations

import json
import os
import subprocess

import comfyui_harness as h

pytestmark = h.requires_comfyui


def test_comfyui_applies_loras_merged_with_its_own_adapters_and_on_the_fly_beside_the_layers(tmp_path,
                                                                                              transformer_path):
    """Two stacked LoRAs (kohya spelling with alpha 2 at 0.7, PEFT at −0.4) on the tiny transformer, through a
    ComfyUI clone of the patched handle. Merged: the patch values are `comfy.weight_adapter.LoRAAdapter`s (never
    dense deltas) and the weights ComfyUI loads equal W + Σ strength·alpha/rank·up@down. On the fly: no weight
    patch at all, every LoRA layer carries its factors after ComfyUI's load, the weights stay untouched and the x0
    equals the hand-merged model's. Loading the unpatched handle restores weights and x0 exactly after both, and
    loading a plain clone of it again keeps the installed (empty) set, under which its CUDA graphs are filed. The
    transformer's release hook (its graphs and parked factors) runs when it is unloaded, not when ComfyUI's
    `load_models_gpu` detaches a loaded clone (itself included) before loading it again: the weights stay put."""
    report_path = tmp_path / "report.json"
    cmd = [h.comfyui_python(), os.path.join(h.PACK_ROOT, "tests", "comfyui_lora_driver.py"),
           "--comfyui", h.comfyui_path(), "--pack", h.PACK_ROOT, "--transformer", transformer_path,
           "--loras", str(tmp_path), "--report", str(report_path)]
    result = subprocess.run(cmd, cwd=str(tmp_path), env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and report_path.exists(), (result.stdout + result.stderr)[-4000:]
    report = json.loads(report_path.read_text())
    merged, on_the_fly = report["merged"], report["on_the_fly"]
    assert report["comfy"] and merged["patch_types"] == ["LoRAAdapter"] and merged["low_rank_layers"] == 0, report
    assert merged["weights_relative_diff"] < 1e-6 and merged["x0_relative_diff"] < 1e-5 and merged["restored"], report
    assert on_the_fly["patch_types"] == [] and on_the_fly["low_rank_layers"] == report["lora_layers"], report
    assert on_the_fly["weights_untouched"] and on_the_fly["x0_relative_diff"] < 1e-5, report
    assert on_the_fly["restored"], report
    assert report["plain_set_kept"], "a plain view loaded again installs a new empty LoRA set (its graphs are lost)"
    assert (report["released_on_reload"], report["released_on_unload"]) == (0, 1), report
