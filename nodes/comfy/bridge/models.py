"""The pack's model management, one API for both hosts: ComfyUI's (comfy_models.py) or the standalone one
(standalone.py)."""
from __future__ import annotations

from typing import Callable

import torch

from .comfy_models import _DeviceHolder, _comfy_discard, _comfy_load, _comfy_patcher, _comfy_spare, _comfy_unload
from .comfyui import HAS_COMFY, _mm
from .devices import compute_device, empty_cache, offload_device
from .standalone import (StandalonePatcher, _standalone_discard, _standalone_live, _standalone_load, _standalone_spare,
                         _standalone_unload)


def make_patcher(module: torch.nn.Module, on_unload: Callable[[torch.nn.Module], None] | None = None,
                 name: str = "model"):
    """Register a heavy module with model management (a ModelPatcher in ComfyUI); weights stay offloaded
    until `load_models` asks for them. `on_unload(module)` runs when model management moves it off the device
    (to free working memory that lives beside the weights, such as CUDA graphs)."""
    if HAS_COMFY:
        return _comfy_patcher(module, on_unload, name)
    return StandalonePatcher(module, compute_device(), offload_device(), on_unload)


def clone_patcher(patcher):
    """A patcher for the same module whose weight patches are its own (ComfyUI: `ModelPatcher.clone()`)."""
    return patcher.clone()


def patch_key_prefix(patcher) -> str:
    """How the patcher's state-dict keys start: ComfyUI patchers of a held module see it as `inner`."""
    return "inner." if HAS_COMFY and isinstance(patcher.model, _DeviceHolder) else ""



def load_models(patchers: list, memory_required: int = 0) -> None:
    """Put `patchers` on the compute device, evicting others when `memory_required` plus their size won't fit; a model
    that still does not fit runs with part of its weights streamed from host memory (streaming.py)."""
    if HAS_COMFY:
        _comfy_load(patchers, memory_required)
        return
    _standalone_load(patchers, memory_required)


def spare_device_memory(patcher) -> int:
    """The working memory `load_models([patcher], memory_required)` can be given without evicting another model:
    the free device memory less the patcher's weights still to place and the reserve model management keeps. For a
    model that cannot stream (the decoders): a streaming model's slots are not counted."""
    if HAS_COMFY:
        return _comfy_spare(patcher)
    return _standalone_spare(patcher)


def unload_model(patcher) -> None:
    """Move one model back to its offload device and forget it (used to free an encoder after use)."""
    if HAS_COMFY:
        _comfy_unload(patcher)
    else:
        _standalone_unload(patcher)
    empty_cache()


def discard_model(patcher) -> None:
    """Free a model whose module its caller drops right after (the text encoder after its encode): its weights are
    freed where they are instead of being copied back to the host first (standalone StandalonePatcher.discard; under
    ComfyUI, model management unloads it to the meta device)."""
    if HAS_COMFY:
        _comfy_discard(patcher)
    else:
        _standalone_discard(patcher)
    empty_cache()


def loaded_model_count() -> int:
    return len(_mm.current_loaded_models) if HAS_COMFY else len(_standalone_live())
