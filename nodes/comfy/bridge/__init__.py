"""The bridge: the only package that touches ComfyUI. Every import of ComfyUI is guarded: without it (CI, scripts,
the headless runner) the same functions fall back to a small standalone device manager, a stderr progress bar and a
models directory (`LTX25_MODELS_DIR`, or the runner's `--models`).

Node code calls only this package, by the names below, for devices, model loading, progress, interrupts, files and
output folders. Its modules, one purpose each:

    comfyui.py       ComfyUI's modules when present (`HAS_COMFY`), None otherwise
    interrupts.py    interrupt request/check, and a headless run's scope
    progress.py      the per-step callback: progress bar, live previews
    node_text.py     a line of text under the running node
    devices.py       devices, their free memory, what can ever fit, the VRAM budget
    models.py        model management, one API for both hosts:
      comfy_models.py  ComfyUI's model management and its partial loads made runnable
      standalone.py    headless placement and eviction
    low_rank.py      LoRAs: factors applied on the fly, weight patches
    folders.py       model, output, temp and user folders

The names here are the submodules' own objects: replacing one here (a test's monkeypatch) changes what node code
calls through `bridge.`, not what the bridge's modules call among themselves; a test faking ComfyUI or a bridge
internal patches the submodule that reads the name (`bridge.progress.HAS_COMFY`, `bridge.devices.memory_limit`).
"""
from __future__ import annotations

from .comfyui import HAS_COMFY
from .devices import (check_fits, compute_device, empty_cache, free_device_memory, intermediate_device, memory_limit,
                      module_bytes, offload_device, set_vram_budget_gb)
from .folders import (list_model_files, model_file_path, output_dir, set_models_dir, set_output_dir, temp_dir,
                      user_directory)
from .interrupts import InterruptError, TaskCheck, check_interrupt, interrupt_scope, request_interrupt
from .low_rank import add_low_rank, low_rank_of, weight_patch
from .models import (clone_patcher, discard_model, load_models, loaded_model_count, make_patcher, patch_key_prefix,
                     spare_device_memory, unload_model)
from .node_text import show_on_node
from .progress import step_callback
from .standalone import FAST_PINNING

__all__ = [
    "HAS_COMFY",
    "check_fits", "compute_device", "empty_cache", "free_device_memory", "intermediate_device",
    "memory_limit", "module_bytes", "offload_device", "set_vram_budget_gb",
    "list_model_files", "model_file_path", "output_dir", "set_models_dir", "set_output_dir",
    "temp_dir", "user_directory",
    "InterruptError", "TaskCheck", "check_interrupt", "interrupt_scope", "request_interrupt",
    "add_low_rank", "low_rank_of", "weight_patch",
    "clone_patcher", "discard_model", "load_models", "loaded_model_count", "make_patcher", "patch_key_prefix",
    "spare_device_memory", "unload_model",
    "show_on_node", "step_callback",
    "FAST_PINNING",
]
