"""LoRAs applied on the fly: a Linear layer (torch's `nn.Linear` or the pack's `QuantizedLinear`) keeps its weight as
loaded and adds its LoRAs' low-rank update to its output,

    y = W·x + b + Σ_i s_i·(alpha_i/r_i)·up_i·(down_i·x)

so a LoRA works on weights kept quantized (NVFP4, FP8, int8-convrot: nothing is dequantized and stored), two graph
branches with different LoRAs share one copy of the weights, and removing a LoRA restores nothing because nothing
was changed.

The update lives on the Linear as two non-persistent buffers, so every mechanism that moves a module's tensors
moves it with the weight and `state_dict()` never shows it: `.to()`, the standalone placement, ComfyUI's per-module
loading and weight streaming (streaming.py streams every tensor a block owns, through the same slots):
    lora_down [R, in]   the LoRAs' down factors stacked (R = the sum of their ranks), in the layer's compute dtype
    lora_up   [out, R]  the up factors side by side, each scaled by its LoRA's strength·alpha/rank
A forward hook, registered once per layer and then kept, adds `up·(down·x)` when the buffers are there and does
nothing when they are not: a LoRA at strength 0 installs nothing, so the output is the base model's bit for bit.
torch.compile does not guard on hooks (`torch._dynamo.config.skip_nnmodule_hook_guards`): a hook added after a block
was compiled is never run by the compiled code, even if the block is compiled again. It does guard on the buffers
the hook reads (their presence, shapes and dtypes). So a model about to be compiled gets the hook on every Linear
first (`hook_layers`), and installing or changing LoRAs afterwards only changes buffers.

Switching views: a model alternating between two views (the dev pipeline's plain stage 1 and its stage 2 with the
distilled LoRA) would copy every factor from the host again at each switch (2.9 s for the distilled LoRA's 8.1 GiB
on an H200, docs/PERFORMANCE.md) and put it at new addresses, which a captured CUDA graph cannot replay. With `keep`
the set a switch removes stays parked beside the model (its tensors, not in any module) and installing it again
puts those very tensors back: no copy, the addresses its graphs were captured with. One set is parked at most (the
last one removed), and whoever placed the model drops it (`drop_parked`) when it goes off the device or its memory
is needed.

Cost per forward: two GEMMs per patched layer, `2·N·R·(in + out)` FLOPs beside the layer's own `2·N·in·out`, i.e.
a fraction `R·(1/in + 1/out)` (about 22% for rank 450 on a 4096×4096 projection); a merge instead costs
`2·out·R·in` once plus a copy of the weight to restore it (bench/bench_lora.py measures both).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from torch import nn

from ..errors import LTX25Error
from ..files.lora import LoraFactors
from ..streaming import forget_host_copies

DOWN, UP = "lora_down", "lora_up"
FLOAT_WEIGHTS = (torch.float32, torch.bfloat16, torch.float16)
QUANTIZED_COMPUTE_DTYPE = torch.bfloat16  # a quantized layer's activations ('as stored' runs them in bf16)
_STATE = "_ltx25_low_rank"               # the installed set's token, on the model
_PARKED = "_ltx25_low_rank_parked"       # (token, {layer name: (down, up)}): the last set removed, kept for reuse

Updates = Mapping[str, Sequence[tuple[float, LoraFactors]]]  # weight key → (strength, factors) per LoRA


@dataclass
class InstallCounts:
    """Layers whose factors `install` copied next to their weight (`built_layers`) or took back from the parked set
    (`reused_layers`) in this process; the benches read them (a warm run of a workflow should build none)."""
    built_layers: int = 0
    reused_layers: int = 0


COUNTS = InstallCounts()


def is_linear(module: nn.Module) -> bool:
    """A layer this module can patch: `nn.Linear` or anything with Linear's `in_features`/`out_features`/`weight`
    (the pack's QuantizedLinear)."""
    return isinstance(module, nn.Linear) or all(hasattr(module, a) for a in ("in_features", "out_features", "weight"))


def compute_dtype(module: nn.Module, model_dtype: torch.dtype = QUANTIZED_COMPUTE_DTYPE) -> torch.dtype:
    """The dtype the layer's activations are in: its weight's for a float layer; for a layer whose weight is stored
    quantized its bias's, else the dtype of the model's float tensors (`model_dtype`)."""
    if module.weight.dtype in FLOAT_WEIGHTS:
        return module.weight.dtype
    bias = getattr(module, "bias", None)
    return bias.dtype if bias is not None else model_dtype


def _model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's float tensors (a quantized model's norms, biases and embeddings)."""
    return next((p.dtype for p in model.parameters() if p.dtype in FLOAT_WEIGHTS), QUANTIZED_COMPUTE_DTYPE)


def _add_low_rank(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    down = module._buffers.get(DOWN)
    if down is None:
        return None
    x = args[0]
    delta = nn.functional.linear(nn.functional.linear(x, down.to(x.dtype)), module._buffers[UP].to(x.dtype))
    return output + delta if output.requires_grad else output.add_(delta)


def _factors_of(key: str, module: nn.Module, entries: Sequence[tuple[float, LoraFactors]], model_dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(down [R, in], up·scale [out, R]) on the weight's device in the layer's compute dtype; None at strength 0."""
    live = [(strength, factors) for strength, factors in entries if strength != 0]
    if not live:
        return None
    shape = (module.out_features, module.in_features)
    for _, factors in live:
        if tuple(factors.shape) != shape:
            raise LTX25Error(key, "the LoRA's shape (out, in)", tuple(factors.shape), shape)
    device, dtype = module.weight.device, compute_dtype(module, model_dtype)
    downs = [f.down.to(device, dtype) for _, f in live]
    down = downs[0] if len(downs) == 1 else torch.cat(downs)
    # strength·alpha/rank folded into up in float32, one rounding to the compute dtype
    up = torch.cat([f.up.to(device, torch.float32) * (s * f.scale) for s, f in live], dim=1).to(dtype)
    return down.contiguous(), up.contiguous()


def _hook(module: nn.Module) -> None:
    if not getattr(module, "_ltx25_low_rank_hooked", False):
        module.register_forward_hook(_add_low_rank)
        module._ltx25_low_rank_hooked = True


def hook_layers(model: nn.Module) -> None:
    """Give every Linear of `model` the (idle) low-rank hook now: call it before torch.compile traces the model, so
    LoRAs installed later are seen by the compiled code (see the module docstring)."""
    for module in model.modules():
        if is_linear(module):
            _hook(module)


def _set(module: nn.Module, factors: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    if factors is None:
        module._buffers.pop(DOWN, None)
        module._buffers.pop(UP, None)
        return
    _hook(module)
    module.register_buffer(DOWN, factors[0], persistent=False)
    module.register_buffer(UP, factors[1], persistent=False)


def patched_layers(model: nn.Module) -> list[str]:
    """Module names of the layers that carry a low-rank update now."""
    return [name for name, m in model.named_modules() if DOWN in m._buffers]


def install(model: nn.Module, updates: Updates, token: object, keep: bool = False) -> bool:
    """Make `model` apply exactly `updates` (weight key `….weight` → its LoRAs' (strength, factors)) on the fly:
    layers not in `updates` lose theirs. The factors are copied next to each layer's weight (which may be on the
    host, when the model is offloaded or streamed). `token` names the set: installing the same token again does
    nothing. `keep`: park the set being removed (module docstring); without it the parked set is dropped. A parked
    set of this token gives its tensors back, each that is still next to its layer's weight in the layer's compute
    dtype. Returns True when what the model computes changed."""
    state = vars(model)
    if token is not None and state.get(_STATE, None) == token:
        return False
    before = set(patched_layers(model))
    parked_token, parked = state.pop(_PARKED, (None, {}))
    reusable = parked if token is not None and parked_token == token else {}
    wanted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    model_dtype = _model_dtype(model)
    for key, entries in updates.items():
        name = key[: -len(".weight")] if key.endswith(".weight") else ""
        try:
            module = model.get_submodule(name) if name else None
        except AttributeError:
            module = None
        if module is None or not is_linear(module):
            raise LTX25Error(key, "a low-rank update's target", "not a Linear layer's weight",
                             "the weight of an nn.Linear or a quantized Linear")
        kept = reusable.get(name)
        if kept is not None and _still_fits(kept, module, model_dtype):
            wanted[name] = kept
            COUNTS.reused_layers += 1
            continue
        factors = _factors_of(key, module, entries, model_dtype)
        if factors is not None:
            wanted[name] = factors
            COUNTS.built_layers += 1
    current = {name: (model.get_submodule(name)._buffers[DOWN], model.get_submodule(name)._buffers[UP])
               for name in before}
    # The placement may keep pinned host copies of device tensors (streaming.place): a replaced factor's would
    # otherwise keep it, and its device memory, alive.
    forget_host_copies(model, [t for pair in current.values() for t in pair])
    previous = state.get(_STATE, None)
    if keep and previous is not None:
        state[_PARKED] = (previous, current)
    for name in before - set(wanted):
        _set(model.get_submodule(name), None)
    for name, factors in wanted.items():
        _set(model.get_submodule(name), factors)
    state[_STATE] = token
    return bool(before or wanted)


def _still_fits(factors: tuple[torch.Tensor, torch.Tensor], module: nn.Module, model_dtype: torch.dtype) -> bool:
    """A parked layer's factors can serve again: beside the layer's weight now, in its compute dtype (the model may
    have been moved or cast since they were made)."""
    dtype = compute_dtype(module, model_dtype)
    return all(t.device == module.weight.device and t.dtype == dtype for t in factors)


def drop_parked(model: nn.Module) -> None:
    """Free the parked set (the model leaves the device, or its memory is needed)."""
    vars(model).pop(_PARKED, None)


def parked_bytes(model: nn.Module) -> int:
    """The bytes of the parked set's tensors (0 when none is parked)."""
    _token, parked = vars(model).get(_PARKED, (None, {}))
    return sum(t.numel() * t.element_size() for pair in parked.values() for t in pair)


def live_tokens(model: nn.Module) -> tuple:
    """The tokens of the sets whose tensors the model holds: the installed one and the parked one. A graph captured
    under another set can never be replayed (its factors are gone)."""
    state = vars(model)
    return state.get(_STATE, None), state.get(_PARKED, (None, {}))[0]


def token_of(model: nn.Module) -> object:
    """The installed set's token (None when none was installed)."""
    return vars(model).get(_STATE, None)


def update_bytes(updates: Updates) -> int:
    """About the bytes the installed buffers of `updates` take: the factors of non-zero strength, at their own
    element size (a bf16 file's, for a bf16 or quantized model)."""
    return sum(f.rank * sum(f.shape) * f.up.element_size() for entries in updates.values() for s, f in entries
               if s != 0)


@dataclass(frozen=True)
class LowRankSet:
    """The LoRAs one model view applies on the fly: weight key → ((strength, factors), …) in the order they were
    added, and a token that changes with every addition (so installing a view's set twice is free)."""
    updates: Mapping[str, tuple[tuple[float, LoraFactors], ...]] = field(default_factory=dict)
    token: uuid.UUID = field(default_factory=uuid.uuid4)

    def plus(self, factors: Mapping[str, LoraFactors], strength: float) -> "LowRankSet":
        updates = dict(self.updates)
        for key, value in factors.items():
            updates[key] = (*updates.get(key, ()), (float(strength), value))
        return LowRankSet(updates)

    def nbytes(self) -> int:
        return update_bytes(self.updates)


# The view without LoRAs on the fly, whoever holds it: one token, so every plain view of a model is one set (its
# graphs are captured once, and installing it again is free).
NO_LOW_RANK = LowRankSet()
