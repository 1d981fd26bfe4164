"""Declarative key maps from the native LTX-2.5 split files to diffusers/transformers module names, and the strict
loader that applies them.

One `KeyMap` per file kind, declared next to its model. A map holds:
- `renames`: anchored prefix renames (`Rename(..., anywhere=False)`) or whole-segment renames matched at dot
  boundaries anywhere in the key (`anywhere=True`), so `q_norm` never matches inside `attn.q_norm_extra`;
- `splits`: one native tensor cut into several module tensors along dim 0 (fused `qkv` → `to_q/to_k/to_v`);
- `drops`: native keys (regex, full match) that no module consumes, each with the reason.
`load_strict` builds the module on the meta device, loads with `assign=True` and refuses anything short of full
coverage. `to_native` runs a map backwards; the tiny-asset writer uses it to emit the exact native names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from ..errors import LTX25Error


@dataclass(frozen=True)
class Rename:
    native: str
    module: str
    anywhere: bool = False  # False: prefix anchored at the key's start; True: whole dotted segments anywhere

    def _sub(self, src: str, dst: str, key: str) -> str:
        src, dst = src.rstrip("."), dst.rstrip(".")
        if not src:  # running a stripped prefix backwards: put it back
            return key if self.anywhere else f"{dst}.{key}"
        lead = r"(?:(?<=\.)|^)" if self.anywhere else "^"
        pattern = re.compile(lead + re.escape(src) + r"(\.|$)")
        return pattern.sub(lambda m: (dst + m.group(1)) if dst else "", key, count=1)

    def forward(self, key: str) -> str:
        return self._sub(self.native, self.module, key)

    def backward(self, key: str) -> str:
        return self._sub(self.module, self.native, key)


@dataclass(frozen=True)
class Split:
    """A fused native tensor (`native` segment) split in equal parts along dim 0 into the `parts` segments."""
    native: str
    parts: tuple[str, ...]

    def _pattern(self, text: str) -> re.Pattern:
        return re.compile(rf"(?:(?<=\.)|^){re.escape(text)}(?=\.)")


@dataclass(frozen=True)
class Drop:
    pattern: str  # regex, full match on the native key
    reason: str


@dataclass(frozen=True)
class KeyMap:
    name: str
    renames: tuple[Rename, ...] = ()
    splits: tuple[Split, ...] = ()
    drops: tuple[Drop, ...] = ()
    _compiled_drops: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled_drops", tuple((re.compile(d.pattern), d) for d in self.drops))

    def with_(self, *, renames: Iterable[Rename] = (), splits: Iterable[Split] = (), drops: Iterable[Drop] = (),
              name: str | None = None) -> "KeyMap":
        """A copy extended by more rows (the base rows apply first)."""
        return KeyMap(name or self.name, self.renames + tuple(renames), self.splits + tuple(splits),
                      self.drops + tuple(drops))

    def drop_reason(self, native_key: str) -> str | None:
        for pattern, drop in self._compiled_drops:
            if pattern.fullmatch(native_key):
                return drop.reason
        return None

    def rename(self, key: str) -> str:
        for rename in self.renames:
            key = rename.forward(key)
        return key

    def apply(self, native: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Native state dict → (module state dict, {dropped native key: reason})."""
        mapped: dict[str, torch.Tensor] = {}
        dropped: dict[str, str] = {}
        for key, tensor in native.items():
            reason = self.drop_reason(key)
            if reason is not None:
                dropped[key] = reason
                continue
            for split in self.splits:
                pattern = split._pattern(split.native)
                if pattern.search(key):
                    for part_name, part in zip(split.parts, tensor.chunk(len(split.parts), dim=0)):
                        mapped[self.rename(pattern.sub(part_name, key, count=1))] = part
                    break
            else:
                mapped[self.rename(key)] = tensor
        return mapped, dropped

    def native_name(self, module_key: str) -> str:
        """The file's name for one module key (what `apply` maps to it): renames run backwards, then a split part
        named by its fused tensor. Errors name the keys a user can look for in the file."""
        key = module_key
        for rename in reversed(self.renames):
            key = rename.backward(key)
        for split in self.splits:
            for part in split.parts:
                pattern = split._pattern(part)
                if pattern.search(key):
                    return pattern.sub(split.native, key, count=1)
        return key

    def to_native(self, module_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Module state dict → native names (the inverse of `apply`, without the dropped keys)."""
        native: dict[str, torch.Tensor] = {}
        for key, tensor in module_state.items():
            for rename in reversed(self.renames):
                key = rename.backward(key)
            native[key] = tensor
        for split in self.splits:
            first = split._pattern(split.parts[0])
            for key in [k for k in native if first.search(k)]:
                names = [first.sub(part, key, count=1) for part in split.parts]
                native[first.sub(split.native, key, count=1)] = torch.cat([native.pop(n) for n in names], dim=0)
        return native


def _first(names: Iterable[str], n: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" … (+{len(names) - n})" if len(names) > n else "")


def _count(names: set, noun: str) -> str:
    return f"{len(names)} {noun}" + ("" if len(names) == 1 else "s")


def check_coverage(where: object, key_map: KeyMap, module: torch.nn.Module, mapped: Mapping[str, torch.Tensor]) -> None:
    """Every persistent parameter/buffer filled with the right shape, and every mapped file key used. Errors name
    the tensors as the file names them (`KeyMap.native_name`)."""
    expected = module.state_dict()
    missing = {key_map.native_name(k) for k in expected.keys() - mapped.keys()}
    unexpected = {key_map.native_name(k) for k in mapped.keys() - expected.keys()}
    if missing or unexpected:
        raise LTX25Error(
            where, f"key coverage for {key_map.name}",
            f"{_count(missing, 'tensor')} missing from the file ({_first(missing)}) and "
            f"{_count(unexpected, 'file tensor')} unused ({_first(unexpected)})",
            f"all {len(expected)} tensors of the model present and every file key used or on the drop list",
            "The file is damaged, from another model, or the key map lacks a row.")
    wrong = [f"{key_map.native_name(k)} {tuple(mapped[k].shape)}≠{tuple(v.shape)}" for k, v in expected.items()
             if tuple(mapped[k].shape) != tuple(v.shape)]
    if wrong:
        raise LTX25Error(where, f"tensor shapes for {key_map.name}", _first(wrong, 3), "the shapes its config implies",
                         "The file's config and its tensors disagree.")


def check_unread(where: object, file_keys: Iterable[str], prefixes: tuple[str, ...], key_map: KeyMap) -> None:
    """A loader that reads only the keys under `prefixes` still accounts for the file's others: each must be on
    `key_map`'s drop list (another component's tensors, dropped by name), else the file is refused naming them."""
    unaccounted = [k for k in file_keys if not k.startswith(prefixes) and key_map.drop_reason(k) is None]
    if unaccounted:
        raise LTX25Error(where, f"tensors outside {', '.join(p + '*' for p in prefixes)}", _first(unaccounted),
                         f"only those the {key_map.name} drops by name", "The file is from another model or damaged.")


def load_strict(where: object, build: Callable[[], torch.nn.Module], native: Mapping[str, torch.Tensor],
                key_map: KeyMap, dtype: torch.dtype | None = None,
                init_buffers: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
    """Build on meta, map keys, check full coverage, load with `assign=True`, re-create non-persistent buffers.

    `dtype` casts floating tensors (dequantization already happened when the file was read). Nothing is
    returned half-built: any shortfall raises `LTX25Error` before or right after the load.
    """
    mapped, _dropped = key_map.apply(native)
    if dtype is not None:
        mapped = {k: v.to(dtype) if v.is_floating_point() else v for k, v in mapped.items()}
    with torch.device("meta"):
        module = build()
    check_coverage(where, key_map, module, mapped)
    module.load_state_dict(mapped, strict=True, assign=True)
    if init_buffers is not None:
        init_buffers(module)
    still_meta = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if still_meta:
        raise LTX25Error(where, f"{key_map.name} after loading", f"{len(still_meta)} tensors left on meta "
                         f"({_first(still_meta)})", "every parameter and buffer materialized",
                         "A non-persistent buffer needs re-creating in init_buffers.")
    return module.eval().requires_grad_(False)
