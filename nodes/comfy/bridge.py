"""The only module that touches ComfyUI. Every import of it is guarded: without ComfyUI (CI, scripts, the
headless runner) the same functions fall back to a small standalone device manager, a stderr progress bar and a
models directory (`LTX25_MODELS_DIR`, or the runner's `--models`).

Node code calls only this module for devices, model loading, progress, interrupts, files and output folders.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
import weakref
from typing import Callable, Iterator

import torch

from ..ltx import compile_cache, streaming
from ..ltx.device_memory import free_bytes
from ..ltx import memory_fit
from ..ltx.memory_fit import host_available_bytes
from ..ltx.files.lora import LoraFactors
from ..ltx.kernels.lora_linear import LowRankSet, install as install_low_rank

log = logging.getLogger("ltx25")

try:  # ComfyUI present: the real thing.
    import comfy.model_management as _mm
    import comfy.model_patcher as _patcher
    import comfy.utils as _comfy_utils
    import folder_paths as _folder_paths

    HAS_COMFY = True
except ImportError:
    _mm = _patcher = _comfy_utils = _folder_paths = None
    HAS_COMFY = False

MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "latent_upscale_models", "loras")


# ---------------------------------------------------------------------------------------------------- interrupts
if HAS_COMFY:
    InterruptError = _mm.InterruptProcessingException
else:
    class InterruptError(Exception):
        """Standalone twin of ComfyUI's InterruptProcessingException."""

_interrupt_requested = False
_run_holds_interrupt = False  # inside `interrupt_scope` a request stays set: every check in the run stops


def request_interrupt() -> None:
    """Ask the running loop to stop at its next step (ComfyUI: POST /interrupt does this)."""
    global _interrupt_requested
    if HAS_COMFY:
        _mm.interrupt_current_processing(True)
    else:
        _interrupt_requested = True


def check_interrupt() -> None:
    """Raise InterruptError when an interrupt was requested. Outside a run the request is used up by the check
    that raises (as ComfyUI's); inside `interrupt_scope` it stays until the run ends, so a save encoding on its
    thread cannot use it up while the node being computed goes on."""
    global _interrupt_requested
    if HAS_COMFY:
        _mm.throw_exception_if_processing_interrupted()
    elif _interrupt_requested:
        if not _run_holds_interrupt:
            _interrupt_requested = False
        raise InterruptError("Processing interrupted")


@contextlib.contextmanager
def interrupt_scope() -> Iterator[None]:
    """One headless run. A request left from before (one that landed where nothing checked it, or while idle) is
    dropped at the start, as ComfyUI's executor does for each prompt, so it cannot stop the next run; inside,
    a request stops every check until the run ends, when it is dropped again."""
    global _interrupt_requested, _run_holds_interrupt
    if HAS_COMFY:
        _mm.interrupt_current_processing(False)
        yield
        return
    _interrupt_requested, _run_holds_interrupt = False, True
    try:
        yield
    finally:
        _interrupt_requested, _run_holds_interrupt = False, False


# ---------------------------------------------------------------------------------------------------- progress
class _StderrProgress:
    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.value = total, label, 0

    def update_absolute(self, value: int, total: int | None = None) -> None:
        self.value, self.total = value, total or self.total
        if os.environ.get("LTX25_QUIET") != "1":
            print(f"\r[{self.label}] {self.value}/{self.total}", end="\n" if value >= self.total else "",
                  file=sys.stderr, flush=True)


def step_callback(total: int, label: str = "ltx25", preview_latent: bool = False) -> Callable[..., None]:
    """A callback for engine loops: checks for interrupt, then reports `done/total` progress.

    With `preview_latent` it also takes the step's x0 video latent `[B, 128, F', H', W']` as a third argument and,
    under ComfyUI, shows its first frame on the running node as core's samplers do: ComfyUI's own previewer for the
    user's preview method with core's LTX-2 latent format (its latent→RGB factors), sent with the progress value.
    Headless, or with previews off, x0 is ignored."""
    bar = _comfy_utils.ProgressBar(total) if HAS_COMFY else _StderrProgress(total, label)
    previewer = _ltx_video_previewer() if preview_latent and HAS_COMFY else None

    def on_step(done: int, total_now: int, x0_video: torch.Tensor | None = None) -> None:
        check_interrupt()
        if previewer is None or x0_video is None:
            bar.update_absolute(done, total_now)
            return
        bar.update_absolute(done, total_now, previewer.decode_latent_to_preview_image("JPEG", x0_video))
        _restore_in_use()  # a TAE previewer loads its model through model management, which may evict ours

    return on_step


def _ltx_video_previewer():
    """ComfyUI's previewer for LTX-2 video latents (`LTXAV`'s factors; `LTXV`'s on versions before LTX-2), or None
    when the user turned previews off or this ComfyUI has no previewer to offer."""
    try:
        import comfy.latent_formats as latent_formats
        import latent_preview
    except ImportError as error:
        log.warning("LTX-2.5: no live previews, ComfyUI's latent_preview is not importable (%s)", error)
        return None
    latent_format = getattr(latent_formats, "LTXAV", None) or latent_formats.LTXV
    return latent_preview.get_previewer(_mm.get_torch_device(), latent_format())


# ---------------------------------------------------------------------------------------------------- node text
def show_on_node(text: str) -> None:
    """A line for the user under the running node (ComfyUI's progress text, where the version has it) and in the
    log; headless, on stderr."""
    log.info(text)
    if not HAS_COMFY:
        if os.environ.get("LTX25_QUIET") != "1":
            print(f"[ltx25] {text}", file=sys.stderr, flush=True)
        return
    try:  # both exist from ComfyUI 0.3.4x; older versions show the log line only
        from comfy_execution.utils import get_executing_context
        from server import PromptServer
    except ImportError:
        return
    context = get_executing_context()
    if context is not None and getattr(PromptServer, "instance", None) is not None:
        PromptServer.instance.send_progress_text(text, context.node_id)


# ---------------------------------------------------------------------------------------------------- devices
def compute_device() -> torch.device:
    if HAS_COMFY:
        return _mm.get_torch_device()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def offload_device() -> torch.device:
    return _mm.unet_offload_device() if HAS_COMFY else torch.device("cpu")


def intermediate_device() -> torch.device:
    """Where latents, images and audio live between nodes (the CPU unless ComfyUI says otherwise)."""
    return _mm.intermediate_device() if HAS_COMFY else torch.device("cpu")


def free_device_memory(device: torch.device | None = None) -> int:
    device = device or compute_device()
    if HAS_COMFY:
        return int(_mm.get_free_memory(device))
    return free_bytes(device)


def memory_limit(device: torch.device | None = None) -> int:
    """The most memory work on `device` can ever have, for refusing what can never fit (not for planning): the
    host's available memory for the CPU; a GPU's total (model management can evict every other model), within
    the headless VRAM budget when one is set."""
    device = device or compute_device()
    if device.type == "cpu":
        return host_available_bytes()
    if HAS_COMFY:
        total = int(_mm.get_total_memory(device))
    elif device.type == "cuda":
        total = int(torch.cuda.mem_get_info(device)[1])
    else:
        return host_available_bytes()  # other accelerators share the host's memory
    cap = _budget_cap()
    return min(total, cap) if cap is not None else total


def check_fits(where: str, what: str, needed: int, device: torch.device, hint: str) -> None:
    """Refuse, naming `where` and both figures, work whose `needed` bytes exceed `memory_limit(device)`."""
    memory = "host memory" if device.type == "cpu" else f"{device.type} memory"
    memory_fit.check_fits(where, what, needed, memory_limit(device), memory, hint)


def empty_cache() -> None:
    if HAS_COMFY:
        _mm.soft_empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- model management
def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


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
        self.low_rank = LowRankSet()

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
        removed) and its merged patches in the weights (another view's undone first, in place, so the weights are
        never copied whole); True when anything changed."""
        changed = install_low_rank(self.model, self.low_rank.updates, self.low_rank.token)
        state = self._patch_state()
        if state["uuid"] == self.patches_uuid:
            return changed
        changed = changed or bool(state["backup"] or self.patches)
        tensors = self.model.state_dict(keep_vars=True)
        # Changed in place below: their pinned host copies (streaming.place) would be stale. A copy of a weight
        # about to be merged for the first time holds its original: it becomes the backup, no copy needed.
        pinned = streaming.forget_host_copies(self.model, [tensors[key] for key in (*state["backup"], *self.patches)])
        backup = state["backup"]  # weight key → its original on the host, only while the module holds it merged
        with torch.no_grad():
            for key in [k for k in backup if k not in self.patches]:
                tensors[key].copy_(backup.pop(key))
            for key, entries in self.patches.items():
                weight = tensors[key]
                if key in backup:  # merged by the previous view: start again from the original
                    original = backup[key].to(weight.device, torch.float32)
                else:  # copied once per merged weight, kept while a view merges it
                    kept = pinned.get(id(weight))
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

    def place(self, memory_required: int) -> None:
        """Put the model on the device within what is free (plus what it already holds there) or the set budget,
        streaming the blocks that do not fit; the plan is logged."""
        device = self.load_device
        _use_fast_pinning(device)
        own = sum(t.numel() * t.element_size() for _, _, t in streaming._owned_tensors(self.model)
                  if t.device.type == device.type)
        # Headroom, as ComfyUI keeps its inference reserve: the conditioning, latents, positions and the allocator's
        # rounding live beside the planned weights and activations (without it a 24 GiB card ran out allocating the
        # streaming slots).
        available = free_device_memory(device) + own - PLACEMENT_HEADROOM if device.type != "cpu" else 1 << 62
        cap = _budget_cap()
        budget = min(available, cap) if cap is not None else available
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


LOW_RANK = "ltx25_low_rank"  # the ComfyUI patcher attachment holding a view's on-the-fly LoRAs


def add_low_rank(patcher, factors: dict[str, LoraFactors], strength: float) -> None:
    """Give `patcher`'s view LoRA factors applied on the fly at `strength` (module state-dict keys of Linear
    weights): installed beside their layers when the view is loaded, never merged into the weights. In ComfyUI
    they ride on the patcher as an attachment (clones copy it), so ComfyUI's own weight patching never sees them."""
    if HAS_COMFY:
        patcher.set_attachments(LOW_RANK, (patcher.get_attachment(LOW_RANK) or LowRankSet()).plus(factors, strength))
    else:
        patcher.low_rank = patcher.low_rank.plus(factors, strength)


def low_rank_of(patcher) -> LowRankSet:
    """The view's on-the-fly LoRAs (empty when it has none)."""
    if HAS_COMFY:
        return patcher.get_attachment(LOW_RANK) or LowRankSet()
    return patcher.low_rank


def _engine_module(patcher) -> torch.nn.Module:
    """The engine module a ComfyUI patcher holds (make_patcher may wrap it in a holder)."""
    inner = getattr(patcher.model, "inner", None)
    return patcher.model if inner is None else inner


def _install_low_rank_comfy(patcher) -> None:
    """After ComfyUI placed the model: install the view's on-the-fly LoRAs next to their layers (on the device, or
    on the host for the blocks left there) and, when blocks stream, rebuild the streamer so the streamed blocks'
    factors pass through the slots with their weights (the old one would put removed factors back)."""
    module, low_rank = _engine_module(patcher), low_rank_of(patcher)
    if install_low_rank(module, low_rank.updates, low_rank.token) and streaming.streamer_of(module) is not None:
        _settle(patcher)  # the factors left on the host move to the device; the streamer is rebuilt over them


def weight_patch(value):
    """The patch value model management applies for one weight: a dense delta → ComfyUI's `(delta,)`; a LoRA's
    `LoraFactors` → ComfyUI's own LoRA adapter (its math: `weight + strength·alpha/rank·up@down`, alpha absent
    → 1, as `LoraFactors.delta`) in ComfyUI, the factors themselves for the standalone patcher."""
    if not isinstance(value, LoraFactors):
        return (value,)
    if not HAS_COMFY:
        return value
    weights = (value.up, value.down, value.alpha, None, None, None)  # up, down, alpha, mid, dora scale, reshape
    try:  # ComfyUI ≥ 0.3.3x: adapter objects
        from comfy.weight_adapter import LoRAAdapter
    except ImportError:  # older ComfyUI reads the tagged tuple
        return ("lora", weights)
    return LoRAAdapter(set(), weights)


# Weak references, like ComfyUI's LoadedModel: a model whose last user dropped it must not be kept alive here.
_standalone_loaded: list[weakref.ref] = []


def _standalone_live() -> list[StandalonePatcher]:
    _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() is not None]
    return [ref() for ref in _standalone_loaded]


class _DeviceHolder(torch.nn.Module):
    """A plain container for a module whose class makes `device` a read-only property (diffusers models):
    ModelPatcher assigns `model.device`, which then lands on the holder."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


def _engine_module(patcher) -> torch.nn.Module:
    model = patcher.model
    return model.inner if isinstance(model, _DeviceHolder) else model


def make_patcher(module: torch.nn.Module, on_unload: Callable[[torch.nn.Module], None] | None = None,
                 name: str = "model"):
    """Register a heavy module with model management (a ModelPatcher in ComfyUI); weights stay offloaded
    until `load_models` asks for them. `on_unload(module)` runs when model management moves it off the device
    (to free working memory that lives beside the weights, such as CUDA graphs)."""
    if HAS_COMFY:
        engine_module = module
        if isinstance(getattr(type(module), "device", None), property):
            module = _DeviceHolder(module)  # Loaded.module stays the model itself
        patcher = _patcher.ModelPatcher(module, load_device=compute_device(), offload_device=offload_device(),
                                        size=module_bytes(module))
        vars(engine_module)["_ltx25_name"] = name
        from comfy.patcher_extension import CallbacksMP

        def on_detach(_patcher, _unpatch_all) -> None:
            streaming.remove_streamer(engine_module)
            vars(engine_module).pop("_ltx25_settled", None)
            if on_unload is not None:
                on_unload(engine_module)
        patcher.add_callback(CallbacksMP.ON_DETACH, on_detach)
        return patcher
    return StandalonePatcher(module, compute_device(), offload_device(), on_unload)


def clone_patcher(patcher):
    """A patcher for the same module whose weight patches are its own (ComfyUI: `ModelPatcher.clone()`)."""
    return patcher.clone()


def patch_key_prefix(patcher) -> str:
    """How the patcher's state-dict keys start: ComfyUI patchers of a held module see it as `inner`."""
    return "inner." if HAS_COMFY and isinstance(patcher.model, _DeviceHolder) else ""


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


def _comfy_load(patchers: list, memory_required: int) -> None:
    global _in_use
    streamable = [p for p in patchers if streaming.blocks_of(_engine_module(p))]
    # What a partly loaded model holds beside ComfyUI's budget for its weights: the two slots streaming copies
    # through, and its weights outside the blocks (which `_settle` loads whatever ComfyUI left). Asked for with the
    # working memory, so model management evicts for them and keeps its budget clear of them.
    reserve = sum(streaming.slot_reserve(_engine_module(p)) + streaming.outside_blocks_bytes(_engine_module(p))
                  for p in streamable if _comfy_streams(p, memory_required))
    # ComfyUI counts state_dict bytes: the on-the-fly LoRA factors (non-persistent buffers) are extra.
    factors = sum(low_rank_of(p).nbytes() for p in patchers)
    # A model without blocks cannot stream: ComfyUI loads it whole (evicting others), as core loads its VAEs.
    _mm.load_models_gpu(patchers, memory_required=memory_required + reserve + factors, force_full_load=not streamable)
    for p in patchers:
        _settle(p)
        _install_low_rank_comfy(p)
    _in_use = ([weakref.ref(p) for p in patchers], memory_required)


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


# ---------------------------------------------------------------------------------------------------- VRAM budget
PLACEMENT_HEADROOM = 1 << 30  # bytes left free beside a standalone placement
_vram_budget_override: int | None = None


def set_vram_budget_gb(gigabytes: float | None) -> None:
    """Headless: cap the device memory the pack's models and their work may use (None: what is free)."""
    global _vram_budget_override
    _vram_budget_override = None if gigabytes is None else int(gigabytes * 2**30)


def _budget_cap() -> int | None:
    if _vram_budget_override is not None:
        return _vram_budget_override
    value = os.environ.get("LTX25_VRAM_BUDGET_GB")
    return int(float(value) * 2**30) if value else None


def load_models(patchers: list, memory_required: int = 0) -> None:
    """Put `patchers` on the compute device, evicting others when `memory_required` plus their size won't fit; a model
    that still does not fit runs with part of its weights streamed from host memory (streaming.py)."""
    if HAS_COMFY:
        _comfy_load(patchers, memory_required)
        return
    needed = memory_required + sum(p.model_size() for p in patchers if not p.is_loaded())
    for other in _standalone_live():
        if other in patchers or other.model in [p.model for p in patchers] or \
                free_device_memory() - PLACEMENT_HEADROOM >= needed:
            continue
        other.unload()
        _standalone_loaded.remove(next(ref for ref in _standalone_loaded if ref() is other))
    empty_cache()
    live = _standalone_live()
    for p in patchers:
        changed = p.apply_patches()
        if changed and p.on_unload is not None:
            p.on_unload(p.model)  # graphs and compiled blocks captured the other weights
        # A placement made for a lighter phase (the connectors) leaves too little room for a heavier one (sampling):
        # plan again for the larger working memory; the larger plan then serves both.
        if changed or not p.is_loaded() or memory_required > p.planned_working_memory():
            p.place(max(memory_required, p.planned_working_memory()))
        if p not in live:
            _standalone_loaded.append(weakref.ref(p))


def unload_model(patcher) -> None:
    """Move one model back to its offload device and forget it (used to free an encoder after use)."""
    global _in_use
    if HAS_COMFY:
        _in_use = ([ref for ref in _in_use[0] if ref() is not patcher], _in_use[1])
        for loaded in list(_mm.current_loaded_models):
            if loaded.model is patcher:
                loaded.model_unload()
                _mm.current_loaded_models.remove(loaded)
        _mm.cleanup_models_gc()
    else:
        patcher.unload()
        _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() not in (None, patcher)]
    empty_cache()


def discard_model(patcher) -> None:
    """Free a model whose module its caller drops right after (the text encoder after its encode): standalone, its
    weights are freed where they are instead of being copied back to the host first (StandalonePatcher.discard);
    under ComfyUI, model management unloads it to its offload device as `unload_model` does."""
    if HAS_COMFY:
        unload_model(patcher)
        return
    patcher.discard()
    _standalone_loaded[:] = [ref for ref in _standalone_loaded if ref() not in (None, patcher)]
    empty_cache()


def loaded_model_count() -> int:
    return len(_mm.current_loaded_models) if HAS_COMFY else len(_standalone_live())


# ---------------------------------------------------------------------------------------------------- files
_models_dir_override: str | None = None


def set_models_dir(path: str) -> None:
    """The headless runner's `--models`: a ComfyUI-style models folder."""
    global _models_dir_override
    _models_dir_override = os.path.abspath(path)
    if HAS_COMFY:
        for folder in MODEL_FOLDERS:
            _folder_paths.add_model_folder_path(folder, os.path.join(_models_dir_override, folder), is_default=True)


def _standalone_models_dir() -> str:
    return _models_dir_override or os.environ.get("LTX25_MODELS_DIR") or os.path.join(os.getcwd(), "models")


if HAS_COMFY and "latent_upscale_models" not in _folder_paths.folder_names_and_paths:
    # ComfyUI before LTX-2 support lacks this folder; register it beside the others.
    _folder_paths.add_model_folder_path("latent_upscale_models",
                                        os.path.join(_folder_paths.models_dir, "latent_upscale_models"))


def list_model_files(folder: str) -> list[str]:
    """Files a loader widget offers (ComfyUI's folder list, or the standalone models directory)."""
    if HAS_COMFY:
        return [f for f in _folder_paths.get_filename_list(folder) if f.endswith((".safetensors", ".sft"))]
    root = os.path.join(_standalone_models_dir(), folder)
    if not os.path.isdir(root):
        return []
    found = []
    for dirpath, _dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f.endswith((".safetensors", ".sft"))]
    return sorted(found)


def model_file_path(folder: str, name: str) -> str:
    if HAS_COMFY:
        path = _folder_paths.get_full_path(folder, name)
    else:
        path = os.path.join(_standalone_models_dir(), folder, name)
        path = path if os.path.isfile(path) else None
    if path is None:
        from ..ltx.errors import LTX25Error
        raise LTX25Error(f"{folder}/{name}", "the model file", "not found",
                         f"a file in the {folder!r} models folder", "Put the official file there (see README).")
    return path


_output_dir_override: str | None = None


def set_output_dir(path: str) -> None:
    global _output_dir_override
    _output_dir_override = os.path.abspath(path)
    if HAS_COMFY:
        _folder_paths.set_output_directory(_output_dir_override)


def output_dir() -> str:
    if HAS_COMFY and _output_dir_override is None:
        return _folder_paths.get_output_directory()
    return _output_dir_override or os.path.join(os.getcwd(), "output")


def temp_dir() -> str:
    if HAS_COMFY:
        return _folder_paths.get_temp_directory()
    return os.path.join(output_dir(), "temp")


def user_directory() -> str | None:
    """ComfyUI's user directory, where the pack keeps its compile cache (compile_cache.py): it lasts across
    restarts, while ComfyUI empties its temp folder at every start. None headless."""
    return _folder_paths.get_user_directory() if HAS_COMFY else None


compile_cache.set_host_root(user_directory)  # asked at the pack's first compilation, after ComfyUI's arguments
