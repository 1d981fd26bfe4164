"""Inspect an LTX-2.5 split file without loading its tensors: header, metadata, component kind, version, dtypes,
quantization. Detection is data (`KIND_RULES`): metadata marker first, key probes second.
"""
from __future__ import annotations

import enum
import json
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import torch
from safetensors import safe_open

from ..errors import LTX25Error
from . import quant

SUPPORTED_MODEL_VERSIONS = ("2.5",)  # major.minor prefixes this pack runs
_MAX_HEADER_BYTES = 100 * 2**20


class Kind(str, enum.Enum):
    TRANSFORMER = "transformer"
    TEXT_ENCODER = "text encoder"
    CONV_VAE = "conv video VAE"
    DIFFUSION_VAE = "diffusion video VAE"
    AUDIO_VAE = "audio VAE"
    UPSAMPLER = "latent upsampler"

    @property
    def with_article(self) -> str:
        """'an audio VAE', 'a transformer': the kind as a message names it."""
        return ("an " if self.value[0] in "aeiou" else "a ") + self.value


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors dtype tag: BF16, F32, U8, F8_E4M3, …
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Header:
    path: str
    metadata: Mapping[str, Any]  # every value JSON-decoded when it parses, else the raw string
    tensors: Mapping[str, TensorInfo]


@dataclass(frozen=True)
class KindRule:
    kind: Kind
    marker: tuple[str, ...]        # metadata path that identifies the kind, with its value ("" = present)
    probes: tuple[str, ...]        # keys whose presence identifies the kind when metadata is stripped
    banned: tuple[str, ...] = ()   # keys that rule the kind out


KIND_RULES: tuple[KindRule, ...] = (
    KindRule(Kind.TRANSFORMER, ("config", "transformer", ""), ("model.diffusion_model.patchify_proj.weight",)),
    KindRule(Kind.TEXT_ENCODER, ("gemma_config", ""), ("tokenizer_json", "model.embed_tokens.weight")),
    KindRule(Kind.DIFFUSION_VAE, ("config", "vae", "_class_name", "CausalDiffusionVAE"),
             ("decoder.conv_in_x_t.weight",)),
    KindRule(Kind.CONV_VAE, ("config", "vae", "_class_name", "CausalVideoAutoencoder"),
             ("decoder.conv_in.conv.weight",), banned=("decoder.conv_in_x_t.weight",)),
    KindRule(Kind.AUDIO_VAE, ("config", "audio_vae", ""), ("audio_vae.decoder.conv_in.conv.weight",)),
    KindRule(Kind.UPSAMPLER, ("config", "_class_name", "LatentUpsampler"), ("initial_conv.weight",)),
)


# How the files this pack never reads begin: torch.save writes a zip (or, before PyTorch 1.6, a bare pickle stream,
# protocol 2+ starting with the PROTO opcode 0x80).
PICKLE_SIGNATURES = {b"PK\x03\x04": "a PyTorch checkpoint (torch.save zip with a pickle inside)",
                     b"\x80": "a Python pickle (an old torch.save / .ckpt / .bin)"}
SAFETENSORS_ONLY = ("This pack reads .safetensors files only: loading a pickle can run any code it holds. Use the "
                    "official .safetensors release (or convert the file with safetensors' own tools).")


def read_header(path: str | os.PathLike) -> Header:
    """Parse the safetensors header (8-byte length + JSON) and check every tensor lies inside the file."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw_len = f.read(8)
            for signature, what in PICKLE_SIGNATURES.items():  # a safetensors header's JSON opens with "{"
                if raw_len.startswith(signature) and f.read(1) != b"{":
                    raise LTX25Error(path, "the file", what, "a safetensors file", SAFETENSORS_ONLY)
                f.seek(8)
            if len(raw_len) < 8:
                raise LTX25Error(path, "the file", f"{size} bytes long", "a safetensors file (8-byte header length)")
            (n,) = struct.unpack("<Q", raw_len)
            if n > min(_MAX_HEADER_BYTES, size - 8):
                raise LTX25Error(path, "the header length", n, f"at most {min(_MAX_HEADER_BYTES, size - 8)} bytes",
                                 "The file is truncated or not a safetensors file (the only format this pack "
                                 "reads).")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LTX25Error(path, "the safetensors header", f"unreadable ({e})", "a JSON header",
                         "Re-download the file.") from e
    if not isinstance(header, dict):
        raise LTX25Error(path, "the safetensors header", type(header).__name__, "a JSON object")
    metadata = {k: _maybe_json(v) for k, v in (header.pop("__metadata__", None) or {}).items()}
    tensors: dict[str, TensorInfo] = {}
    data_size = size - 8 - n
    for name, entry in header.items():
        try:
            begin, end = entry["data_offsets"]
            tensors[name] = TensorInfo(entry["dtype"], tuple(entry["shape"]))
        except (KeyError, TypeError, ValueError) as e:
            raise LTX25Error(path, f"header entry {name!r}", entry, "{dtype, shape, data_offsets}") from e
        if end > data_size:
            raise LTX25Error(path, f"tensor {name!r}", f"stored up to byte {end}", f"within the {data_size} data bytes",
                             "The file is truncated; re-download it.")
    return Header(path, metadata, tensors)


def _maybe_json(value: str) -> Any:
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value


def _metadata_path(metadata: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    *keys, value = path
    node: Any = metadata
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return value == "" or node == value


def identify(header: Header) -> Kind:
    """Metadata first; key probes when metadata is stripped; an error when nothing or several match."""
    by_meta = [r.kind for r in KIND_RULES if _metadata_path(header.metadata, r.marker)]
    if len(by_meta) == 1:
        return by_meta[0]
    by_keys = [r.kind for r in KIND_RULES
               if all(p in header.tensors for p in r.probes) and not any(b in header.tensors for b in r.banned)]
    if len(by_keys) == 1:
        return by_keys[0]
    found = "ambiguous (" + ", ".join(k.value for k in by_keys) + ")" if by_keys else "unrecognized"
    raise LTX25Error(header.path, "the component kind", found,
                     "one of " + ", ".join(k.value for k in Kind),
                     "Neither its metadata nor its key names match an LTX-2.5 split file.")


@dataclass(frozen=True)
class AssetInfo:
    path: str
    kind: Kind
    model_version: str | None
    gemma_version: str | None       # transformer: gemma_source_checkpoint; text encoder: gemma_config
    dtypes: Mapping[str, int]        # dtype tag → tensor count
    quantization: str | None        # None, "fp8", "nvfp4" or "int8"
    header: Header

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def summary(self) -> str:
        dtypes = ", ".join(f"{d}×{n}" for d, n in sorted(self.dtypes.items()))
        parts = [f"{self.name}: {self.kind.value}", f"{len(self.header.tensors)} tensors ({dtypes})"]
        if self.model_version:
            parts.append(f"model_version {self.model_version}")
        if self.gemma_version:
            parts.append(f"gemma {self.gemma_version}")
        if self.quantization:
            parts.append(self.quantization)
        return ", ".join(parts)


def _gemma_version(kind: Kind, metadata: Mapping[str, Any]) -> str | None:
    source = metadata.get("gemma_source_checkpoint" if kind is Kind.TRANSFORMER else "gemma_config")
    return source.get("gemma_version") if isinstance(source, Mapping) else None


@lru_cache(maxsize=64)
def _inspect_cached(path: str, mtime_ns: int, size: int) -> AssetInfo:
    header = read_header(path)
    kind = identify(header)
    version = header.metadata.get("model_version")
    dtypes: dict[str, int] = {}
    for info in header.tensors.values():
        dtypes[info.dtype] = dtypes.get(info.dtype, 0) + 1
    return AssetInfo(path, kind, str(version) if version is not None else None, _gemma_version(kind, header.metadata),
                     dtypes, quant.detect(header.tensors), header)


def inspect_asset(path: str | os.PathLike) -> AssetInfo:
    """Header-only inspection (cached by path, mtime and size)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise LTX25Error(path, "the file", "missing", "an existing .safetensors file")
    st = os.stat(path)
    return _inspect_cached(path, st.st_mtime_ns, st.st_size)


def expect_kind(path: str | os.PathLike, kind: Kind | tuple[Kind, ...]) -> AssetInfo:
    """Inspect and refuse a file of the wrong kind (a slot may take several), or a model_version this pack does
    not run."""
    info = inspect_asset(path)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if info.kind not in kinds:
        wanted = " or ".join(k.with_article for k in kinds)
        raise LTX25Error(info.path, "this file", info.kind.with_article, f"{wanted} for this slot",
                         f"Pick {wanted} file (official names in the README).")
    if info.model_version is not None and not info.model_version.startswith(SUPPORTED_MODEL_VERSIONS):
        raise LTX25Error(info.path, "model_version", info.model_version,
                         " or ".join(v + ".x" for v in SUPPORTED_MODEL_VERSIONS),
                         "This pack runs the LTX-2.5 split files only.")
    return info


def model_version_tuple(version: str | None) -> tuple[int, ...]:
    """'2.5.0' or '2.5.0-rc1' → (2, 5, 0); None → (0,)."""
    if not version:
        return (0,)
    core = version.split("-")[0].split("+")[0]
    return tuple(int(p) for p in core.split(".") if p.isdigit())


def check_gemma_pairing(transformer: AssetInfo, text_encoder: AssetInfo) -> None:
    """The transformer's `gemma_source_checkpoint.gemma_version` must equal the encoder's `gemma_config.gemma_version`."""
    want, have = transformer.gemma_version, text_encoder.gemma_version
    if want is None and model_version_tuple(transformer.model_version) >= (2, 4):
        raise LTX25Error(transformer.path, "gemma_source_checkpoint.gemma_version", "absent",
                         "a Gemma version tag for model_version ≥ 2.4", "The transformer metadata was stripped.")
    if want != have:
        raise LTX25Error(text_encoder.path, "gemma_config.gemma_version", have,
                         f"{want} (what {transformer.name} was trained with)",
                         "Use the text encoder released with this transformer.")


def read_state_dict(path: str | os.PathLike, dtype: torch.dtype | None = None,
                    prefixes: tuple[str, ...] = (), keep_quantized: bool = False) -> dict[str, torch.Tensor]:
    """Load tensors (only keys starting with one of `prefixes`, when given), quantized weights (NVFP4, FP8, int8)
    dequantized to `dtype` (bfloat16 when None) unless `keep_quantized`. Non-quantized tensors keep their stored
    dtype; `load_strict` casts them."""
    path = os.fspath(path)
    info = inspect_asset(path)
    with safe_open(path, framework="pt") as f:
        keys = [k for k in f.keys() if not prefixes or k.startswith(prefixes)]
        state = {k: f.get_tensor(k) for k in keys}
    if info.quantization and not keep_quantized:
        state = quant.dequantize_state_dict(path, state, dtype or torch.bfloat16, info.header.metadata)
    return state
