"""Model placement without ComfyUI (the headless runner, scripts, the CPU suite): a patcher with the parts of
ComfyUI's ModelPatcher the pack uses, and a small manager that evicts other models when a load needs the room."""
from __future__ import annotations

import logging
import uuid
import weakref
from typing import Callable

import torch

from ...ltx import streaming
from ...ltx.device_memory import AMPLE_BYTES
from ...ltx.files.lora import LoraFactors
from ...ltx.kernels.lora_linear import NO_LOW_RANK, install as install_low_rank
from .devices import PLACEMENT_HEADROOM, _budget_cap, empty_cache, free_device_memory, module_bytes
from .node_text import show_on_node

log = logging.getLogger("ltx25")


# Pinned host memory from malloc + cudaHostRegister on several threads instead of torch's default cudaHostAlloc: on
# an H200 host 55 GB/s instead of 2.5 GB/s to allocate and fill, which is what streaming and evicting a model spend
# on pinning (docs/PERFORMANCE.md). Set only without ComfyUI: in ComfyUI the process's allocators are ComfyUI's.
FAST_PINNING = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
_fast_pinning_set = False


def _use_fast_pinning(device: torch.device) -> None:
    global _fast_pinning_set
    if _fast_pinning_set or device.type != "cuda":
        return
    _fast_pinning_set = True
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    try:
        setter(FAST_PINNING)
    except (RuntimeError, AttributeError) as error:  # an older torch: default pinning, slower but correct
        log.info("LTX-2.5: fast pinned allocation unavailable (%s)", error)


class StandalonePatcher:
    """The parts of ComfyUI's ModelPatcher the pack uses, for running without ComfyUI: placement (with weight
    streaming when the model does not fit), clones that share the module, weight patches merged in place when a
    clone is loaded (the merged weights' originals kept on the host, once per model, as ComfyUI keeps its backups),
    and LoRAs applied on the fly (`low_rank`: installed beside their layers, nothing backed up)."""

    def __init__(self, model: torch.nn.Module, load_device: torch.device, offload_device: torch.device,
                 on_unload: Callable[[torch.nn.Module], None] | None = None) -> None:
        self.model, self.load_device, self.offload_device = model, load_device, offload_device
        self.on_unload = on_unload
        self.patches: dict[str, list[tuple[float, tuple]]] = {}
        self.patches_uuid = uuid.uuid4()
        self.low_rank = NO_LOW_RANK

    def model_size(self) -> int:
        return module_bytes(self.model)

    def clone(self) -> "StandalonePatcher":
        twin = StandalonePatcher(self.model, self.load_device, self.offload_device, self.on_unload)
        twin.patches = {key: list(entries) for key, entries in self.patches.items()}
        twin.patches_uuid, twin.low_rank = self.patches_uuid, self.low_rank
        return twin

    def add_patches(self, patches: dict, strength_patch: float = 1.0) -> list[str]:
        """ComfyUI's shape: `{state-dict key: (delta,) or low-rank factors}` (`weight_patch`); the weight becomes
        `weight + strength·delta` on load, a low-rank delta formed only then, one weight at a time."""
        state = self.model.state_dict(keep_vars=True)
        added = [key for key in patches if key in state]
        for key in added:
            self.patches.setdefault(key, []).append((strength_patch, patches[key]))
        self.patches_uuid = uuid.uuid4()
        return added

    def _patch_state(self) -> dict:
        return vars(self.model).setdefault("_ltx25_patch_state", {"uuid": None, "backup": {}})

    def apply_patches(self) -> bool:
        """Make the shared module compute this patcher's view: its on-the-fly LoRAs installed (another view's
        removed, and parked beside the model while it is placed and not streaming, so switching back costs no copy
        and keeps the addresses that view's CUDA graphs read) and its merged patches in the weights (another view's
        undone first, in place, so the weights are never copied whole); True when anything changed."""
        # Parked only while the model is placed on its device and not streaming: factors parked on the host (the
        # model offloaded) could never serve again beside the weights once they are placed.
        changed = install_low_rank(self.model, self.low_rank.updates, self.low_rank.token,
                                   keep=self.is_loaded() and not streaming.is_streaming(self.model))
        state = self._patch_state()
        if state["uuid"] == self.patches_uuid:
            return changed
        changed = changed or bool(state["backup"] or self.patches)
        tensors = self.model.state_dict(keep_vars=True)
        # Changed in place below: their host copies (streaming.place) would be stale. A copy of a weight about to
        # be merged for the first time holds its original: it becomes the backup, no copy needed.
        host_copies = streaming.forget_host_copies(self.model,
                                                   [tensors[key] for key in (*state["backup"], *self.patches)])
        backup = state["backup"]  # weight key → its original on the host, only while the module holds it merged
        with torch.no_grad():
            for key in [k for k in backup if k not in self.patches]:
                tensors[key].copy_(backup.pop(key))
            for key, entries in self.patches.items():
                weight = tensors[key]
                if key in backup:  # merged by the previous view: start again from the original
                    original = backup[key].to(weight.device, torch.float32)
                else:  # copied once per merged weight, kept while a view merges it
                    kept = host_copies.get(id(weight))
                    backup[key] = kept if kept is not None else weight.detach().to("cpu", copy=True)
                    original = weight.float()
                patched = original + sum(strength * _patch_delta(value, weight.device) for strength, value in entries)
                weight.copy_(patched.to(weight.dtype))
        state["uuid"] = self.patches_uuid
        return changed

    def is_loaded(self) -> bool:
        """Placed on the device by `place` (wholly, or with its blocks streaming) and not unloaded since."""
        return vars(self.model).get("_ltx25_placed") is not None

    def planned_working_memory(self) -> int:
        """The working memory the current placement left room for (0 when not placed)."""
        placed = vars(self.model).get("_ltx25_placed")
        return placed[2] if placed is not None else 0

    def _budget(self, device: torch.device) -> int:
        """The bytes a placement may plan with: what is free plus what the model already holds there, within the
        set budget."""
        own = sum(t.numel() * t.element_size() for _, _, t in streaming._owned_tensors(self.model)
                  if t.device.type == device.type)
        # Headroom, as ComfyUI keeps its inference reserve: the conditioning, latents, positions and the allocator's
        # rounding live beside the planned weights and activations (without it a 24 GiB card ran out allocating the
        # streaming slots).
        available = free_device_memory(device) + own - PLACEMENT_HEADROOM if device.type != "cpu" else AMPLE_BYTES
        cap = _budget_cap()
        return min(available, cap) if cap is not None else available

    def place(self, memory_required: int) -> None:
        """Put the model on the device within what is free (plus what it already holds there) or the set budget,
        streaming the blocks that do not fit; the plan is logged."""
        device = self.load_device
        _use_fast_pinning(device)
        budget = self._budget(device)
        if self.on_unload is not None and module_bytes(self.model) + memory_required > budget:
            # What the model keeps beside its weights (CUDA graphs, a parked LoRA set) must not make it stream: it is
            # released and the plan made with that memory free.
            self.on_unload(self.model)
            empty_cache()
            budget = self._budget(device)
        name = type(self.model).__name__
        if not streaming.blocks_of(self.model):
            # A model without blocks (the decoders) asks for its untiled working memory so that much is freed if
            # possible, as ComfyUI's load_models_gpu does; its auto tiling then plans within what is really free,
            # so what is missing is not an error here (the tiling refuses with figures if even its floor is short).
            memory_required = min(memory_required, max(budget - module_bytes(self.model), 0))
        plan = streaming.place(self.model, device, budget, memory_required, where=name, keep_host=True)
        vars(self.model)["_ltx25_placed"] = (str(device), budget, memory_required)
        show_on_node(plan.describe(name))

    def unload(self) -> None:
        vars(self.model).pop("_ltx25_placed", None)
        if self.load_device != self.offload_device:
            streaming.offload(self.model, self.offload_device, keep_host=True)
        else:
            streaming.remove_streamer(self.model)
        if self.on_unload is not None:
            self.on_unload(self.model)

    def discard(self) -> None:
        """Unload for good, copying nothing back (streaming.discard): the module is unusable afterwards."""
        vars(self.model).pop("_ltx25_placed", None)
        streaming.discard(self.model)
        if self.on_unload is not None:
            self.on_unload(self.model)


def _patch_delta(value, device: torch.device) -> torch.Tensor:
    """A standalone patch value's dense float32 delta on `device`: `(delta,)` as given, a LoRA's factors multiplied
    out here (so a whole-model LoRA never exists densely)."""
    if isinstance(value, LoraFactors):
        return value.delta(device)
    return value[0].to(device, torch.float32)


# Weak references, like ComfyUI's LoadedModel: a model whose last user dropped it must not be kept alive here.
_standalone_loaded: list[weakref.ref] = []


def _standalone_live() -> list[StandalonePatcher]:
    _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() is not None]
    return [ref() for ref in _standalone_loaded]


def _standalone_load(patchers: list, memory_required: int) -> None:
    """`load_models` without ComfyUI."""
    needed = memory_required + sum(p.model_size() for p in patchers if not p.is_loaded())
    others = [o for o in _standalone_live() if o not in patchers and o.model not in [p.model for p in patchers]]

    def short() -> bool:
        return free_device_memory() - PLACEMENT_HEADROOM < needed
    # The cheap memory first: what live models keep beside their weights (CUDA graphs, a parked LoRA set) is dropped
    # before any model is unloaded (reloading the transformer costs seconds, a graph capture a fraction of one).
    for other in others:
        if other.on_unload is not None and short():
            other.on_unload(other.model)
            empty_cache()
    for other in others:
        if short():
            other.unload()
            _standalone_loaded.remove(next(ref for ref in _standalone_loaded if ref() is other))
    empty_cache()
    live = _standalone_live()
    for p in patchers:
        # A view change keeps the graphs: each is filed under the weights and LoRA factors it reads and replayed only
        # while the model holds exactly those (accelerated_denoise.py).
        changed = p.apply_patches()
        # A placement made for a lighter phase (the connectors) leaves too little room for a heavier one (sampling):
        # plan again for the larger working memory; the larger plan then serves both.
        if changed or not p.is_loaded() or memory_required > p.planned_working_memory():
            p.place(max(memory_required, p.planned_working_memory()))
        if p not in live:
            _standalone_loaded.append(weakref.ref(p))


def _standalone_spare(patcher) -> int:
    """`spare_device_memory` without ComfyUI: `_standalone_load` evicts when the request and the weights still to
    place exceed the free memory less the placement headroom."""
    to_place = 0 if patcher.is_loaded() else patcher.model_size()
    return max(free_device_memory() - PLACEMENT_HEADROOM - to_place, 0)


def _standalone_unload(patcher) -> None:
    """`unload_model` without ComfyUI."""
    patcher.unload()
    _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() not in (None, patcher)]


def _standalone_discard(patcher) -> None:
    """`discard_model` without ComfyUI."""
    patcher.discard()
    _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() not in (None, patcher)]
