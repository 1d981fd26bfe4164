"""ComfyUI's model management for the pack's models: a ModelPatcher per model, `load_models_gpu` for each load, and
what makes its partial loads runnable for plain torch modules (below); the models a run uses are loaded again when
something evicted them mid-run."""
from __future__ import annotations

import logging
import weakref
from typing import Callable

import torch

from ...ltx import streaming
from ...ltx.device_memory import graph_pool_idle_bytes
from ...ltx.dit.accelerated_denoise import drop_graphs
from ...ltx.files.mapped_pages import FileMappings
from ...ltx.kernels.lora_linear import install as install_low_rank
from .comfyui import _mm, _patcher
from .devices import compute_device, module_bytes, offload_device
from .low_rank import low_rank_of
from .node_text import show_on_node

log = logging.getLogger("ltx25")


class _DeviceHolder(torch.nn.Module):
    """A plain container for a module whose class makes `device` a read-only property (diffusers models):
    ModelPatcher assigns `model.device`, which then lands on the holder."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


def _engine_module(patcher) -> torch.nn.Module:
    model = patcher.model
    return model.inner if isinstance(model, _DeviceHolder) else model


def _comfy_patcher(module: torch.nn.Module, on_unload: Callable[[torch.nn.Module], None] | None, name: str):
    """`make_patcher` in ComfyUI: a ModelPatcher whose detach drops the pack's streamer and settled plan."""
    engine_module = module
    if isinstance(getattr(type(module), "device", None), property):
        module = _DeviceHolder(module)  # Loaded.module stays the model itself
    patcher = _patcher.ModelPatcher(module, load_device=compute_device(), offload_device=offload_device(),
                                    size=module_bytes(module))
    vars(engine_module)["_ltx25_name"] = name
    vars(engine_module)["_ltx25_release"] = on_unload
    from comfy.patcher_extension import CallbacksMP

    def on_detach(_patcher, unpatch_all) -> None:
        # `load_models_gpu` detaches every loaded clone of a model it is asked to load, the asked patcher itself
        # included, with unpatch_all=False: the weights stay where they are, so what lives beside them (CUDA graphs,
        # filed under the addresses they read) is kept unless the blocks streamed (graphs are not used then).
        keep = not unpatch_all and not streaming.is_streaming(engine_module)
        streaming.remove_streamer(engine_module)
        vars(engine_module).pop("_ltx25_settled", None)
        if on_unload is not None and not keep:
            on_unload(engine_module)
    patcher.add_callback(CallbacksMP.ON_DETACH, on_detach)
    return patcher


# ---------------------------------------------------------------------------------------------------- ComfyUI placement
# How ComfyUI 0.33's ModelPatcher places a model (comfy/model_patcher.py, `_load_list`, `load`, `partially_unload`):
# its unit is a module holding parameters of its own and none below it (a Linear, a norm, an embedding). Under a
# partial load (`lowvram_model_memory` short of the model: LOW_VRAM or NORMAL_VRAM with too little free, NO_VRAM
# always) it moves and patches the largest units that fit and marks each with `comfy_patched_weights = True`; the
# other units stay on the offload device, unpatched, and a parent module's own parameters and the buffers of
# parameterless modules stay there too, even in a full load until its final `model.to(device)`. Core's layers
# (comfy.ops) then cast host weights per call and apply patches on the fly; ours are plain torch modules and cannot,
# so after each `load_models_gpu` `_settle` makes the placement runnable: the units left inside streamable blocks
# stream through the device (streaming.py), patched on each copy as core patches a lowvram weight; every other unit
# left behind is loaded the way ModelPatcher loads one (patched on the device, moved, marked), and loose tensors are
# moved. A later eviction (`partially_unload`, moving units back and unmarking them) is settled again on next use.

def _is_load_unit(module: torch.nn.Module) -> bool:
    """ModelPatcher's loading unit: parameters of its own, none in any submodule."""
    own = {id(p) for p in module._parameters.values() if p is not None}
    return bool(own) and all(id(p) in own for p in module.parameters())


def _on_device(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device == streaming._concrete(device)


def _move_own(table: dict, name: str, device: torch.device) -> int:
    """Move one tensor of a module's own table onto `device`; the bytes moved."""
    old = table[name]
    if old is None or _on_device(old, device):
        return 0
    new = old.detach().to(device)
    table[name] = torch.nn.Parameter(new, requires_grad=old.requires_grad) if isinstance(old, torch.nn.Parameter) \
        else new
    return new.numel() * new.element_size()


def _load_unit(patcher, prefix: str, module: torch.nn.Module, device: torch.device) -> int:
    """Load one unit model management left behind as ModelPatcher.load loads one: its patched weights computed on the
    device (originals kept in the patcher's backup), the rest moved, the unit marked loaded so ComfyUI never patches
    it twice and may unload it again. The bytes now resident."""
    for name in module._parameters:
        key = prefix + name
        if key in patcher.patches:
            patcher.patch_weight_to_device(key, device_to=device)
    module.to(device)
    module.comfy_patched_weights = True
    return module_bytes(module)


def _streamed_weight_patch(patcher, key: str):
    """Core's lowvram weight patch (ComfyUI's own LoRA math, in the weight's dtype) for a streamed weight: applied to
    its device copy in every forward, so the host copy stays the original."""
    return _patcher.LowVramPatch(key, patcher.patches)


def _placement_token(patcher) -> tuple:
    """What a partial unload or an unload by model management changes (`_restore_in_use` compares it)."""
    model = patcher.model
    return (model.model_loaded_weight_memory, str(getattr(model, "device", None)), model.current_weight_patches_uuid)


def _settle(patcher) -> None:
    """Make ComfyUI's placement of the patcher's model runnable (see the section comment) and show the plan when it
    changed."""
    model, engine = patcher.model, _engine_module(patcher)
    device = torch.device(patcher.load_device)
    blocks = streaming.blocks_of(engine)
    in_block = {id(m) for block in blocks for m in block.modules()}
    streamed: set[int] = set()
    transforms: dict[tuple[int, str], Callable] = {}
    loaded_here = 0
    for path, module in model.named_modules():
        prefix = f"{path}." if path else ""
        if _is_load_unit(module):
            if getattr(module, "comfy_patched_weights", False) is True:
                continue
            if id(module) in in_block:
                streamed.add(id(module))
                for name in module._parameters:
                    if prefix + name in patcher.patches:
                        transforms[(id(module), name)] = _streamed_weight_patch(patcher, prefix + name)
            else:
                loaded_here += _load_unit(patcher, prefix, module, device)
            continue
        for table in (module._parameters, module._buffers):  # loose tensors: ComfyUI neither moves nor patches them
            for name in list(table):
                if table is module._parameters and prefix + name in patcher.patches \
                        and prefix + name not in patcher.backup:
                    patcher.patch_weight_to_device(prefix + name, device_to=device)
                loaded_here += _move_own(table, name, device)
    # `loaded_here` stays out of ComfyUI's count (`model_loaded_weight_memory`): its next partial load refills that
    # count with the largest units first, which would put more of the blocks beside these on the device; it sees
    # them as used memory, as it sees the slots.
    if streamed:  # part of the weights is not resident: a later load with more room may load more (as core's)
        model.model_lowvram = True
    streamer = None
    if blocks:
        streamer = streaming.adopt(engine, device, select=lambda owner, _name, _tensor: id(owner) in streamed,
                                   transform=lambda owner, name: transforms.get((id(owner), name)))
    plan = (streamer.streamed_count, sum(s.nbytes for s in streamer.streamed.values())) if streamer else (0, 0)
    previous = vars(engine).get("_ltx25_settled")
    vars(engine)["_ltx25_settled"] = (_placement_token(patcher), plan)
    if plan[0] and (previous is None or previous[1] != plan):
        name = vars(engine).get("_ltx25_name", type(engine).__name__)
        show_on_node(f"{name}: model management left part of it in host memory: {plan[0]} of {len(blocks)} blocks "
                     f"stream {plan[1] / 2**30:.2f} GiB per forward through the device, "
                     f"{(patcher.model_size() - plan[1]) / 2**30:.2f} GiB stay on it")
    elif loaded_here and not blocks:
        log.info("%s: loaded whole beside model management's partial load (it has no blocks to stream)",
                 type(engine).__name__)


def _comfy_streams(patcher, memory_required: int) -> bool:
    """Whether load_models_gpu will leave part of the model on the host, by its own rule: NO_VRAM always; LOW_VRAM and
    NORMAL_VRAM when the model is larger than the free memory (other models evictable) less what the work needs."""
    device = patcher.load_device
    state = _mm.vram_state
    if _mm.is_device_cpu(device) or state not in (_mm.VRAMState.LOW_VRAM, _mm.VRAMState.NORMAL_VRAM,
                                                  _mm.VRAMState.NO_VRAM):
        return False
    if state == _mm.VRAMState.NO_VRAM:
        return True
    others = sum(loaded.model_loaded_memory() for loaded in _mm.current_loaded_models
                 if loaded.device == device and loaded.model is not None and loaded.model is not patcher)
    free = _mm.get_free_memory(device) + others + patcher.loaded_size()
    needed = max(_mm.minimum_inference_memory(), memory_required + _mm.extra_reserved_memory())
    budget = max(free - needed, min(free * _mm.MIN_WEIGHT_MEMORY_RATIO, free - _mm.minimum_inference_memory()))
    return patcher.model_size() > budget


# The models the last load asked for, with its working memory: a preview decoded between steps may load a model
# (ComfyUI's TAE previewers do) and make model management evict part of them mid-run.
_in_use: tuple[list[weakref.ref], int] = ([], 0)


def _release_unreplayable(patchers: list) -> None:
    """Before a load plans, drop what could never replay, so its pool memory does not count as taken: run the release
    hook of each model whose weights carry another view's merged patches (ComfyUI unpatches them, new tensors, in
    this load), and drop the graphs of each model that model management moved since it was settled (a partial
    unload by another model's load: ComfyUI has no callback for it)."""
    released = False
    for p in patchers:
        engine = _engine_module(p)
        release = vars(engine).get("_ltx25_release")
        if release is not None and getattr(p.model, "current_weight_patches_uuid", None) not in (None, p.patches_uuid):
            release(engine)
            released = True
        settled = vars(engine).get("_ltx25_settled")
        if settled is not None and settled[0] != _placement_token(p):
            released |= drop_graphs(engine)
    if released:
        _mm.soft_empty_cache()  # the graphs' pool back to the driver before ComfyUI reads the free memory


def _comfy_load(patchers: list, memory_required: int) -> None:
    global _in_use
    _release_unreplayable(patchers)
    # CUDA graphs kept across loads hold idle memory in their private pools, which ComfyUI's free memory counts as
    # free: asked for on top, so model management evicts for the work as if that memory were taken.
    asked = memory_required + max((graph_pool_idle_bytes(torch.device(p.load_device)) for p in patchers), default=0)
    streamable = [p for p in patchers if streaming.blocks_of(_engine_module(p))]
    # What a partly loaded model holds beside ComfyUI's budget for its weights: the two slots streaming copies
    # through, and its weights outside the blocks (which `_settle` loads whatever ComfyUI left). Asked for with the
    # working memory, so model management evicts for them and keeps its budget clear of them.
    reserve = sum(streaming.slot_reserve(_engine_module(p)) + streaming.outside_blocks_bytes(_engine_module(p))
                  for p in streamable if _comfy_streams(p, asked))
    # ComfyUI counts state_dict bytes: the on-the-fly LoRA factors (non-persistent buffers) are extra.
    factors = sum(low_rank_of(p).nbytes() for p in patchers)
    # Weights still views of their file's map: those ComfyUI's load copies to the device give their pages back after
    # it (streaming.release_moved), so the file never counts in the process's memory beside the copies.
    files = FileMappings.current()
    views = {id(p): streaming.mapped_views(_engine_module(p), files) for p in patchers}
    # A model without blocks cannot stream: ComfyUI loads it whole (evicting others), as core loads its VAEs.
    _mm.load_models_gpu(patchers, memory_required=asked + reserve + factors, force_full_load=not streamable)
    for p in patchers:
        _settle(p)
        _install_low_rank_comfy(p)
        streaming.release_moved(_engine_module(p), views.pop(id(p)), files)
    _in_use = ([weakref.ref(p) for p in patchers], memory_required)


def _comfy_spare(patcher) -> int:
    """`spare_device_memory` in ComfyUI: `load_models_gpu` evicts until the free memory covers the weights still to
    load × 1.1 plus the larger of its inference minimum and the request, each with the `--reserve-vram` reserve;
    `_comfy_load` adds the on-the-fly LoRA factors to the request. With `--disable-smart-memory` every load evicts
    every other model: nothing is spare. On the CPU (`--cpu`) it frees nothing and the weights already rest where they
    compute: all the free memory is spare."""
    device = torch.device(patcher.load_device)
    factors = low_rank_of(patcher).nbytes()
    if device == torch.device("cpu"):  # load_models_gpu's own test: it calls free_memory for every other device
        return max(int(_mm.get_free_memory(device)) - factors, 0)
    if getattr(_mm, "DISABLE_SMART_MEMORY", False):
        return 0
    to_load = max(patcher.model_size() - patcher.loaded_size(), 0)
    # ComfyUI's free memory counts CUDA graphs' idle pool memory as free too; a decode beside their model cannot use it
    free = _mm.get_free_memory(device) - graph_pool_idle_bytes(device)
    room = free - 1.1 * to_load - _mm.extra_reserved_memory()
    if room < _mm.minimum_inference_memory() - _mm.extra_reserved_memory():
        return 0
    return max(int(room) - factors, 0)


def _install_low_rank_comfy(patcher) -> None:
    """After ComfyUI placed the model: install the view's on-the-fly LoRAs next to their layers (on the device, or
    on the host for the blocks left there) and, when blocks stream, rebuild the streamer so the streamed blocks'
    factors pass through the slots with their weights (the old one would put removed factors back)."""
    module, low_rank = _engine_module(patcher), low_rank_of(patcher)
    if install_low_rank(module, low_rank.updates, low_rank.token) and streaming.streamer_of(module) is not None:
        _settle(patcher)  # the factors left on the host move to the device; the streamer is rebuilt over them


def _restore_in_use() -> None:
    """Load the models in use again if model management moved any of them since their load."""
    refs, memory_required = _in_use
    patchers = [p for p in (ref() for ref in refs) if p is not None]
    if not patchers:
        return
    loaded = {id(entry.model) for entry in _mm.current_loaded_models}
    moved = [p for p in patchers if id(p) not in loaded
             or (vars(_engine_module(p)).get("_ltx25_settled") or (None,))[0] != _placement_token(p)]
    if moved:
        log.info("LTX-2.5: model management moved %s during the run; loading again",
                 ", ".join(type(_engine_module(p)).__name__ for p in moved))
        _comfy_load(patchers, memory_required)


def _comfy_unload(patcher) -> None:
    """`unload_model` in ComfyUI: out of model management's list, and out of the models in use."""
    global _in_use
    _in_use = ([ref for ref in _in_use[0] if ref() is not patcher], _in_use[1])
    for loaded in list(_mm.current_loaded_models):
        if loaded.model is patcher:
            loaded.model_unload()
            _mm.current_loaded_models.remove(loaded)
    _mm.cleanup_models_gc()


def _comfy_discard(patcher) -> None:
    """`discard_model` in ComfyUI: unloaded by model management as `unload_model` does, but to the meta device.
    Its unload moves the module to the patcher's offload device (ModelPatcher.unpatch_model: `model.to(device_to)`),
    so for a model its caller drops right after (Gemma after its encode) that was a copy of every weight on the card
    into new host memory, up to 24 GiB, made only to be freed."""
    offload_device, patcher.offload_device = patcher.offload_device, torch.device("meta")
    try:
        _comfy_unload(patcher)
    finally:
        patcher.offload_device = offload_device
