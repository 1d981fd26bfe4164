"""LoRA files for the LTX-2.5 transformer (docs/MODEL.md §15.5): every key spelling the files in circulation use,
mapped onto the loaded module's parameter names, with full coverage (each file key is used or refused by name).

A LoRA stays low-rank here: `LoraFactors` carries `up [out, r]`, `down [r, in]` and the optional `alpha`, and the
dense delta `alpha/r · up·down` is formed only while a patcher applies it to one weight (never for the whole model
at once). Key spellings (file key = prefix + module path + suffix):

| prefix | module path in | written by |
|---|---|---|
| `diffusion_model.` | native names (the file's, without `model.diffusion_model.`) | the LTX-2 trainer, ComfyUI |
| `model.diffusion_model.` | native names | checkpoint-style exports |
| `lora_unet_` | native names with `.` → `_` | kohya-style trainers |
| `transformer.` | diffusers names (`dit.` here) | diffusers / PEFT |

Suffixes: `.lora_A.weight` / `.lora_B.weight` (PEFT: down, up), `.lora_down.weight` / `.lora_up.weight` (kohya,
ComfyUI) with an optional `.alpha`, and ComfyUI's dense `.diff` (a weight's delta) and `.diff_b` (a bias's delta).

A LoRA pair may target a Linear whose weight is stored quantized (NVFP4, FP8, int8): it is applied on the fly
(kernels/lora_linear.py) and its shape is checked against the layer's `[out, in]`, not the packed tensor's. A dense
delta cannot be added to a quantized weight and is refused.

IC-LoRA control adapters (the LTX-2 trainer's reference-video LoRAs) are LoRA files of the PEFT spelling above; what
sets them apart is the safetensors metadata the reference's IC-LoRA pipeline reads (`ReferenceScales`): the factor
the reference video is scaled down by in space and in time.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Union

import torch
from safetensors import SafetensorError, safe_open

from ..errors import LTX25Error
from ..release import OFFICIAL_FILES
from .assets import Header, identify, read_header
from .keymap import KeyMap

NATIVE_PREFIX = "model.diffusion_model."
# IC-LoRA metadata (the trainer writes each as a decimal string; absent = 1): spatial, its older name, temporal.
SPATIAL_KEYS = ("reference_spatial_scale_factor", "reference_downscale_factor")
TEMPORAL_KEY = "reference_temporal_scale_factor"
HDR_KEYS = ("hdr_transform", "use_hdr_transform")  # the HDR IC-LoRA's: its output needs an HDR decode
# file-key suffix → the role of the tensor it names
SUFFIXES = (
    (".lora_A.weight", "down"), (".lora_B.weight", "up"),
    (".lora_down.weight", "down"), (".lora_up.weight", "up"),
    (".alpha", "alpha"), (".diff_b", "diff_b"), (".diff", "diff"),
)
PAIR_SPELLINGS = {"lora_A/lora_B": (".lora_A.weight", ".lora_B.weight"),
                  "lora_down/lora_up": (".lora_down.weight", ".lora_up.weight")}
PATCHABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class LoraFactors:
    """One weight's low-rank update: `delta = scale · up @ down`, `scale = alpha / rank` (1 without an alpha, as
    ComfyUI and the reference read PEFT files, which store no alpha)."""
    up: torch.Tensor     # [out, rank]
    down: torch.Tensor   # [rank, in]
    alpha: float | None = None

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.up.shape[0], self.down.shape[1]

    @property
    def scale(self) -> float:
        return 1.0 if self.alpha is None else self.alpha / self.rank

    def delta(self, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense `[out, in]` delta on `device` in `dtype` (float32 accumulation, like ComfyUI's)."""
        up, down = self.up.to(device, torch.float32), self.down.to(device, torch.float32)
        return (torch.mm(up, down) * self.scale).to(dtype)


Patch = Union[LoraFactors, torch.Tensor]  # a low-rank update, or a dense delta of the parameter's shape


@dataclass(frozen=True)
class ReferenceScales:
    """An IC-LoRA's reference-video scaling, from its metadata (the reference's `iclora_utils`): the reference video
    is encoded at `1/spatial` of the output's width and height and keeps frame 0 then every `temporal`-th frame."""
    spatial: int = 1
    temporal: int = 1


@dataclass(frozen=True)
class LoraFile:
    """A read LoRA file: its patches (module state-dict key → LoraFactors or dense delta) and its IC-LoRA
    reference scaling (1, 1 for a plain LoRA)."""
    patches: Mapping[str, "Patch"]
    reference: ReferenceScales = ReferenceScales()


@dataclass(frozen=True)
class LoraTargets:
    """Every spelling a LoRA file may use for a patchable parameter → the module's parameter key."""
    spellings: Mapping[str, str]        # file-key base (prefix + path, no suffix) → module key without .weight/.bias
    ambiguous: frozenset[str]           # spellings two parameters share (kohya's `_` joins): refused if used
    tensors: Mapping[str, torch.Tensor]  # module state dict (keep_vars): shapes and dtypes to check against
    # every Linear's `….weight` → its (out, in), also where the tensor is packed (quantized)
    matrices: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, module: torch.nn.Module, key_map: KeyMap, native_prefix: str = NATIVE_PREFIX,
           diffusers_prefix: tuple[str, str] = ("transformer.", "dit.")) -> "LoraTargets":
        """From a loaded module and the key map it was loaded with (native file names ↔ module names).
        `diffusers_prefix`: (file prefix, module prefix) of the diffusers spelling."""
        tensors = module.state_dict(keep_vars=True)
        spellings: dict[str, str] = {}
        seen: dict[str, set[str]] = defaultdict(set)
        for key in tensors:
            base, dot, leaf = key.rpartition(".")
            if leaf not in ("weight", "bias") or not dot:
                continue
            native = next(iter(key_map.to_native({key: tensors[key]})))
            names = []
            if native.startswith(native_prefix):
                path = native[len(native_prefix):].rpartition(".")[0]
                names += [f"diffusion_model.{path}", f"{native_prefix}{path}", "lora_unet_" + path.replace(".", "_")]
            file_prefix, module_prefix = diffusers_prefix
            if base.startswith(module_prefix):
                names.append(file_prefix + base[len(module_prefix):])
            for name in names:
                seen[name].add(base)
                spellings[name] = base
        ambiguous = frozenset(name for name, bases in seen.items() if len(bases) > 1)
        matrices = {f"{name}.weight": (m.out_features, m.in_features) for name, m in module.named_modules()
                    if all(hasattr(m, a) for a in ("in_features", "out_features", "weight"))}
        return cls(spellings, ambiguous, tensors, matrices)


def _split(key: str) -> tuple[str, str, str] | None:
    """file key → (base, suffix, role), or None for a key of no LoRA form."""
    for suffix, role in SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], suffix, role
    return None


def _refuse(path: str, key: str, found: str, expected: str, hint: str = "") -> LTX25Error:
    return LTX25Error(f"{path} [{key}]", "the LoRA key", found, expected, hint)


def read_lora(path: str | os.PathLike, targets: LoraTargets) -> dict[str, Patch]:
    """A LoRA file → {module state-dict key: LoraFactors or dense delta} (`read_lora_file`'s patches)."""
    return dict(read_lora_file(path, targets).patches)


def read_lora_file(path: str | os.PathLike, targets: LoraTargets) -> LoraFile:
    """A LoRA file → its patches ({module state-dict key: LoraFactors or dense delta}, tensors in the file's dtype on
    the CPU) and IC-LoRA reference scaling. Every file key is used, or an `LTX25Error` names the file and the key:
    unknown forms, parameters the model does not have, half pairs, mixed spellings, wrong shapes, dense deltas on
    quantized weights, NaN or infinite values; metadata the pack cannot honour (an HDR IC-LoRA, a scale that is no
    positive integer) too. A damaged or non-safetensors file, or an LTX-2.5 file of another kind, is refused from
    its header, before any tensor is read."""
    path = str(path)
    header = read_header(path)  # a truncated, empty or pickle file is refused here, naming the file
    if not header.tensors:
        raise LTX25Error(path, "the LoRA file", "empty", "LoRA tensors (…lora_A.weight / …lora_down.weight …)")
    # Key names are checked from the header before any tensor is read: a whole checkpoint dropped into the loras
    # folder by mistake is refused at once, not after tens of GB have been read.
    groups: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)   # module base → role → (file key, suffix)
    for key in sorted(header.tensors):
        parts = _split(key)
        if parts is None:
            raise _another_asset(header) or _refuse(
                path, key, "of no LoRA form", "a name ending in " + ", ".join(s for s, _ in SUFFIXES),
                "DoRA, LoHa, LoKr and other adapters are not supported.")
        base, suffix, role = parts
        if base in targets.ambiguous:
            raise _refuse(path, key, f"ambiguous ({base!r} names more than one parameter)", "a dotted name")
        target = targets.spellings.get(base)
        if target is None:
            raise _refuse(path, key, "for no parameter of the LTX-2.5 transformer",
                          "a diffusion_model. / model.diffusion_model. / lora_unet_ / transformer. name of a "
                          "transformer parameter", "The LoRA is for another model (a LoRA only works with the "
                          "model it was trained on), or its names are in a spelling this pack does not read.")
        if role in groups[target]:
            raise _refuse(path, key, f"a second {role} for {target}", f"one (already {groups[target][role][0]})")
        groups[target][role] = (key, suffix)
    try:
        with safe_open(path, "pt") as f:
            metadata = dict(f.metadata() or {})
            reference = reference_scales(path, metadata)
            tensors = {key: f.get_tensor(key) for roles in groups.values() for key, _ in roles.values()}
    except SafetensorError as e:
        raise LTX25Error(path, "the safetensors file", f"unreadable ({e})", "a valid safetensors file",
                         "The file is damaged; re-download it.") from e
    patches: dict[str, Patch] = {}
    for target, roles in groups.items():
        patches.update(_patches_for(path, target, roles, tensors, targets))
    return LoraFile(patches, reference)


def _another_asset(header: Header) -> LTX25Error | None:
    """The error for an LTX-2.5 file of another kind (transformer, VAE, …) chosen as a LoRA, None for any other."""
    try:
        kind = identify(header)
    except LTX25Error:
        return None
    folder, name = OFFICIAL_FILES[kind.name.lower()]
    return LTX25Error(header.path, "this file", f"the LTX-2.5 {kind.value}", "a LoRA",
                      f"Put it in models/{folder}/ (like {name}) and load it with its own loader.")


def _check_finite(path: str, key: str, tensor: torch.Tensor) -> torch.Tensor:
    # A NaN or an infinity in one factor spreads through every step and gives a black or noise video, silently.
    if not bool(torch.isfinite(tensor).all()):
        raise _refuse(path, key, "holding NaN or infinite values", "finite numbers",
                      "The file is damaged or was saved from a diverged training run; re-download or re-export it.")
    return tensor


def _positive_int(path: str, key: str, value: str) -> int:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not (number >= 1 and number == int(number)):
        raise LTX25Error(f"{path} [metadata {key}]", "the value", repr(value), "a whole number ≥ 1 (as the LTX-2 "
                         "trainer writes it)", "The file's IC-LoRA metadata is damaged.")
    return int(number)


def reference_scales(path: str, metadata: Mapping[str, str]) -> ReferenceScales:
    """The IC-LoRA reference scaling in a LoRA file's metadata (1, 1 when absent, as in the reference). The spatial
    factor is written under two names; both present and different, or an HDR IC-LoRA, is refused naming the key."""
    hdr = [key for key in HDR_KEYS if metadata.get(key)]
    if hdr:
        raise LTX25Error(f"{path} [metadata {hdr[0]}]", "the IC-LoRA", f"an HDR IC-LoRA ({hdr[0]}="
                         f"{metadata[hdr[0]]!r})", "an IC-LoRA for standard video", "Its output is log-encoded HDR "
                         "that needs the reference's HDR decode, which this pack does not have.")
    spatial = {key: _positive_int(path, key, metadata[key]) for key in SPATIAL_KEYS if key in metadata}
    if len(set(spatial.values())) > 1:
        raise LTX25Error(f"{path} [metadata {SPATIAL_KEYS[1]}]", "the value", spatial[SPATIAL_KEYS[1]],
                         f"{spatial[SPATIAL_KEYS[0]]} (its {SPATIAL_KEYS[0]})", "The two names of the reference "
                         "video's downscale factor disagree: the file's IC-LoRA metadata is damaged.")
    temporal = _positive_int(path, TEMPORAL_KEY, metadata[TEMPORAL_KEY]) if TEMPORAL_KEY in metadata else 1
    return ReferenceScales(next(iter(spatial.values()), 1), temporal)


def _patches_for(path: str, target: str, roles: Mapping[str, tuple[str, str]], tensors: Mapping[str, torch.Tensor],
                 targets: LoraTargets) -> dict[str, Patch]:
    model = targets.tensors
    out: dict[str, Patch] = {}
    weight_key, bias_key = f"{target}.weight", f"{target}.bias"
    if "diff_b" in roles:
        out[bias_key] = _dense(path, roles["diff_b"][0], tensors, model, bias_key)
    if "diff" in roles:
        out[weight_key] = _dense(path, roles["diff"][0], tensors, model, weight_key)
    pair = {role: roles[role] for role in ("down", "up") if role in roles}
    if not pair:
        if "alpha" in roles:
            raise _refuse(path, roles["alpha"][0], "an alpha without its pair", "…lora_down/…lora_up beside it")
        return out
    if "diff" in roles:
        raise _refuse(path, roles["diff"][0], f"a dense diff beside a LoRA pair for {target}", "one or the other")
    if len(pair) == 1:
        (role, (key, _)), = pair.items()
        missing = "up (lora_B / lora_up)" if role == "down" else "down (lora_A / lora_down)"
        raise _refuse(path, key, "half of a LoRA pair", f"its {missing} partner as well")
    spellings = {name for name, ends in PAIR_SPELLINGS.items() if {s for _, s in pair.values()} <= set(ends)}
    if not spellings:
        raise _refuse(path, roles["down"][0], f"paired with {roles['up'][0]}", "lora_A with lora_B, or lora_down "
                      "with lora_up")
    shape = targets.matrices.get(weight_key)
    if shape is None:
        raise _refuse(path, roles["down"][0], f"aimed at {target}, which has no matrix weight",
                      "a Linear layer's weight")
    down, up = tensors[roles["down"][0]], tensors[roles["up"][0]]
    if down.ndim != 2 or up.ndim != 2 or up.shape[1] != down.shape[0] or (up.shape[0], down.shape[1]) != shape:
        raise _refuse(path, roles["down"][0], f"shaped down {tuple(down.shape)}, up {tuple(up.shape)}",
                      f"down [rank, {shape[1]}] and up [{shape[0]}, rank] for {weight_key}",
                      "The LoRA was trained for another model size.")
    alpha = None
    if "alpha" in roles:
        value = tensors[roles["alpha"][0]]
        if value.numel() != 1:
            raise _refuse(path, roles["alpha"][0], f"shaped {tuple(value.shape)}", "a scalar")
        alpha = float(_check_finite(path, roles["alpha"][0], value).float().item())
    _check_finite(path, roles["down"][0], down)
    _check_finite(path, roles["up"][0], up)
    out[weight_key] = LoraFactors(up, down, alpha)
    return out


def _dense(path: str, key: str, tensors: Mapping[str, torch.Tensor], model: Mapping[str, torch.Tensor],
           module_key: str) -> torch.Tensor:
    weight = model.get(module_key)
    if weight is None:
        raise _refuse(path, key, f"aimed at {module_key}, which the model does not have", "an existing parameter")
    _check_patchable(path, key, weight, module_key)
    if tuple(tensors[key].shape) != tuple(weight.shape):
        raise _refuse(path, key, f"shaped {tuple(tensors[key].shape)}", f"{tuple(weight.shape)} ({module_key})")
    return _check_finite(path, key, tensors[key])


def _check_patchable(path: str, key: str, weight: torch.Tensor, module_key: str) -> None:
    if weight.dtype not in PATCHABLE_DTYPES:
        raise _refuse(path, key, f"a dense delta aimed at {module_key}, stored {weight.dtype} (quantized)",
                      "a float weight (LoRA pairs work on quantized weights, dense deltas do not)",
                      "Load the transformer with weight_dtype bf16 (dequantized) to apply this file.")
