"""The LTX-2.5 text encoder: Gemma-4 12B (transformers `gemma4_unified`) + the V2 text projection, loaded from
the single official file `gemma4-12b-with-proj-ltx-2.5-bf16.safetensors` (docs/MODEL.md §2.1, §3).

- `TextEncoderSpec.from_file` reads only the header, the `gemma_config` metadata and the small tokenizer tensors;
  the 24 GB of weights are read by `load_text_encoder` only when a prompt is not cached.
- `encode_prompts` tokenizes (`gemma_tokenizer`), runs ONE batched Gemma forward under `torch.inference_mode()`,
  projects (`text_projection`) and frees Gemma again (Lightricks/LTX-2 issue #310: outside inference mode the
  outputs keep Gemma's graph and weights alive). Results are cached per (file, prompt).
- GPU placement stays outside the engine: callers pass `load_hook`/`release_hook` (the node routes them through
  ComfyUI's model management); without hooks the module runs where it was loaded (the CPU).
"""
from __future__ import annotations

import copy
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from safetensors import safe_open
from torch import nn
from transformers.models.gemma4_unified import configuration_gemma4_unified as gemma_config
from transformers.models.gemma4_unified import modeling_gemma4_unified as gemma_modeling

from ..files import assets
from ..files.assets import AssetInfo, Kind
from ..conditioning import TextFeatures
from ..errors import LTX25Error
from .tokenizer import MAX_TOKENS, GemmaTokenizer
from ..files.keymap import Drop, KeyMap, Rename, load_strict
from ..kernels.quantized_linear import load_keeping_quantized
from .projection import TextProjection

PROJECTION = "text_embedding_projection."
TOKENIZER_KEY = "tokenizer_json"
ASSET_PREFIX = "hf_asset__"

# Comfy-flat Gemma-4 names → our container (`gemma` = transformers' Gemma4UnifiedModel, text part only).
KEY_MAP = KeyMap(
    "Gemma-4 text encoder",
    renames=(Rename("model", "gemma.language_model"),),  # model.layers.N.* / model.embed_tokens / model.norm
    drops=(
        Drop(r"vision_model\..*", "image embedder (patch LN/Dense/pos-emb); prompts are text only"),
        Drop(r"multi_modal_projector\..*", "image → text-space projection; prompts are text only"),
        Drop(r"audio_projector\..*", "audio → text-space projection; prompts are text only"),
        Drop(TOKENIZER_KEY, "tokenizer bytes, read by TextEncoderSpec"),
        Drop(ASSET_PREFIX + r".*", "HF sidecar files (tokenizer/processor config, chat template), not weights"),
    ),
)
# No `lm_head` is built: prompt encoding stops at the hidden states (the reference calls `model.model`), and the
# file has none either (tied to embed_tokens).


ENCODER_DEVICES = ("auto", "cpu")


@dataclass(frozen=True)
class TextEncoderSpec:
    """LTX25_TEXT_ENCODER: the checked file, its Gemma config and tokenizer; no weights.

    `config` is the HF `Gemma4UnifiedConfig` from the file's `gemma_config`; `video_dim`/`audio_dim` are the
    projection widths read from the tensor shapes (4096/2048; tiny 64/32)."""
    info: AssetInfo
    dtype: torch.dtype | None  # None: 'as stored' (quantized layers stay quantized, the rest bf16)
    config: gemma_config.Gemma4UnifiedConfig = field(compare=False, repr=False)
    tokenizer: GemmaTokenizer = field(compare=False, repr=False)
    video_dim: int
    audio_dim: int
    device: str = "auto"  # "auto": the compute device through model management; "cpu": Gemma runs on the CPU

    @property
    def path(self) -> str:
        return self.info.path

    @property
    def text_config(self) -> gemma_config.Gemma4UnifiedTextConfig:
        return self.config.text_config

    @property
    def num_states(self) -> int:
        """Hidden states the projection reads: embedding output + one per layer (49; tiny 7)."""
        return self.text_config.num_hidden_layers + 1

    @classmethod
    def from_file(cls, path: str | os.PathLike, dtype: torch.dtype | None = torch.bfloat16,
                  device: str = "auto") -> "TextEncoderSpec":
        info = assets.expect_kind(path, Kind.TEXT_ENCODER)
        config = parse_gemma_config(info.path, info.header.metadata.get("gemma_config"))
        hidden, n_states = config.text_config.hidden_size, config.text_config.num_hidden_layers + 1
        dims = []
        for stream in ("video", "audio"):
            key = f"{PROJECTION}{stream}_aggregate_embed.weight"
            shape = info.header.tensors[key].shape if key in info.header.tensors else None
            if shape is None:
                v1 = PROJECTION + "aggregate_embed.weight" in info.header.tensors
                raise LTX25Error(info.path, f"tensor {key}", "absent",
                                 "the V2 per-stream projection of LTX-2.3/2.5",
                                 "This is an LTX-2.0 (V1) projection." if v1 else "The file is not an LTX-2.5 encoder.")
            if len(shape) != 2 or shape[1] != hidden * n_states:
                raise LTX25Error(info.path, f"shape of {key}", shape,
                                 f"[out, {hidden}×{n_states}] (hidden × (layers + 1) from gemma_config)")
            dims.append(shape[0])
        if device not in ENCODER_DEVICES:
            raise LTX25Error(info.path, "the encoder device", repr(device), " or ".join(map(repr, ENCODER_DEVICES)))
        return cls(info, dtype, config, _read_tokenizer(info), dims[0], dims[1], device)


def parse_gemma_config(where: str, raw: object) -> gemma_config.Gemma4UnifiedConfig:
    """`gemma_config` metadata (HF config JSON) → `Gemma4UnifiedConfig`; only `gemma4_unified` is supported."""
    if not isinstance(raw, dict):
        raise LTX25Error(where, "metadata gemma_config", type(raw).__name__, "an HF config JSON object")
    if raw.get("model_type") != "gemma4_unified":
        raise LTX25Error(where, "gemma_config.model_type", repr(raw.get("model_type")), "'gemma4_unified'",
                         "LTX-2.5 pairs with the Gemma-4 text encoder released with it.")
    try:
        return gemma_config.Gemma4UnifiedConfig.from_dict(copy.deepcopy(raw))
    except (TypeError, ValueError) as e:
        raise LTX25Error(where, "gemma_config", f"rejected by transformers ({e})",
                         "a valid Gemma4UnifiedConfig") from e


def _read_tokenizer(info: AssetInfo) -> GemmaTokenizer:
    """Read only the small U8 tensors (tokenizer bytes, tokenizer_config.json), never the weights."""
    config_key = ASSET_PREFIX + "tokenizer_config.json"
    if TOKENIZER_KEY not in info.header.tensors:
        raise LTX25Error(info.path, f"tensor {TOKENIZER_KEY}", "absent", "the tokenizer bytes of the Gemma pack")
    with safe_open(info.path, framework="pt") as f:
        blob = _tensor_bytes(f.get_tensor(TOKENIZER_KEY))
        if config_key in info.header.tensors:
            where = f"tensor {config_key}"
            try:
                tokenizer_config = json.loads(_tensor_bytes(f.get_tensor(config_key)).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise LTX25Error(info.path, where, f"unreadable ({e})", "the UTF-8 JSON of tokenizer_config.json",
                                 "The text-encoder file is damaged; re-download it.") from e
        elif "tokenizer_config.json" in info.header.metadata:  # older packs keep small sidecars in metadata
            where, tokenizer_config = "metadata tokenizer_config.json", info.header.metadata["tokenizer_config.json"]
        else:
            raise LTX25Error(info.path, f"tensor {config_key}", "absent", "the tokenizer config sidecar")
    if not isinstance(tokenizer_config, dict):
        raise LTX25Error(info.path, where, f"a JSON {type(tokenizer_config).__name__}", "a JSON object",
                         "The text-encoder file is damaged; re-download it.")
    return GemmaTokenizer.from_bytes(info.path, blob, tokenizer_config)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    if tensor.dtype not in (torch.uint8, torch.int8):  # Comfy packs sometimes store the bytes as int8
        raise LTX25Error("tokenizer asset", "tensor dtype", tensor.dtype, "uint8 bytes")
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------------------------- module
class TextEncoderModule(nn.Module):
    """`gemma`: transformers' Gemma4UnifiedModel without the image/audio embedders (their 11 tensors are on the
    drop list: the smallest model that covers every used key); `text_embedding_projection`: the V2 projection."""

    PIN_STREAMED = False  # one forward per new prompt: layers that do not fit stream from the file (streaming.py)

    def __init__(self, config: gemma_config.Gemma4UnifiedConfig, video_dim: int, audio_dim: int) -> None:
        super().__init__()
        text_only = copy.deepcopy(config)
        text_only.vision_config = text_only.audio_config = None
        self.gemma = gemma_modeling.Gemma4UnifiedModel(text_only)
        text = text_only.text_config
        self.text_embedding_projection = TextProjection(text.hidden_size, text.num_hidden_layers + 1,
                                                        video_dim, audio_dim)

    def streamable_blocks(self) -> list[nn.ModuleList]:
        """The repeated blocks weight streaming may keep on the host (streaming.py): Gemma's decoder layers."""
        return [self.gemma.language_model.layers]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids, mask [B, T] → (video [B, T, video_dim], audio [B, T, audio_dim]); call under inference mode.

        Same call as the reference's `model.model(...)`: default positions `arange(T)` whatever the mask (left
        padding ⇒ a prompt of n tokens sits at positions T-n … T-1), all hidden states returned: h[0] = scaled
        embeddings, h[L] = final-norm output. No KV cache: nothing is generated."""
        out = self.gemma(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                         use_cache=False)
        hidden_states = list(out.hidden_states)
        del out
        return self.text_embedding_projection(hidden_states, attention_mask)


def init_buffers(module: TextEncoderModule) -> None:
    """Re-create the non-persistent buffers a meta build leaves empty: RoPE inverse frequencies (per layer type,
    computed by transformers' own rotary class from the file's rope_parameters) and the embedding scale."""
    language = module.gemma.language_model
    fresh = type(language.rotary_emb)(language.config)
    for name, buffer in fresh.named_buffers():
        language.rotary_emb.register_buffer(name, buffer, persistent=False)
    embed = language.embed_tokens
    embed.register_buffer("embed_scale", torch.tensor(embed.scalar_embed_scale), persistent=False)


def load_text_encoder(spec: TextEncoderSpec) -> TextEncoderModule:
    """Read the weights and build the module strictly (every used key filled, every other key on the drop list).
    `spec.dtype` None ('as stored'): quantized Linears stay quantized (QuantizedLinear), the rest bf16."""
    build = lambda: TextEncoderModule(spec.config, spec.video_dim, spec.audio_dim)  # noqa: E731
    if spec.dtype is None:
        native = assets.read_state_dict(spec.path, keep_quantized=True)
        return load_keeping_quantized(spec.path, build, native, spec.info.header.metadata, KEY_MAP, init_buffers)
    native = assets.read_state_dict(spec.path, spec.dtype)
    return load_strict(spec.path, build, native, KEY_MAP, spec.dtype, init_buffers)


def working_memory(spec: TextEncoderSpec, batch: int) -> int:
    """Bytes one batched encode of `batch` prompts needs beyond the weights: ~3 copies of the [B, T, D, L] stack + the
    MLP intermediates."""
    text, elem = spec.text_config, torch.finfo(spec.dtype or torch.bfloat16).bits // 8  # None: as stored, bf16
    return batch * MAX_TOKENS * (3 * text.hidden_size * spec.num_states + 4 * text.intermediate_size) * elem


def run_encoder(module: TextEncoderModule, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                on_step: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One batched forward under `torch.inference_mode()` on the module's device: ids, mask [B, T] →
    (video [B, T, video_dim], audio [B, T, audio_dim]) inference tensors on that device. `on_step(done, total)`
    runs after each decoder layer and after the projection (progress + interrupt)."""
    layers = module.gemma.language_model.layers
    total = len(layers) + 1
    hooks = []
    if on_step is not None:
        for i, layer in enumerate(layers):
            hooks.append(layer.register_forward_hook(lambda *_, done=i + 1: on_step(done, total)))
    device = next(module.parameters()).device
    try:
        with torch.inference_mode():
            video, audio = module(input_ids.to(device), attention_mask.to(device))
    finally:
        for hook in hooks:
            hook.remove()
    if on_step is not None:
        on_step(total, total)
    return video, audio


# ---------------------------------------------------------------------------------------------------- lifecycle
LoadHook = Callable[[nn.Module, object], object]
ReleaseHook = Callable[[object], None]
CACHE_SIZE = 16  # prompts; real: 12 MiB each (video 1024×4096 + audio 1024×2048, bf16)
_cache: "OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]" = OrderedDict()
_resident: dict[tuple, tuple[nn.Module, object]] = {}  # at most one kept-loaded encoder


def _file_key(spec: TextEncoderSpec) -> tuple:
    st = os.stat(spec.path)
    return (spec.path, st.st_mtime_ns, st.st_size, str(spec.dtype))


def clear_caches() -> None:
    """Forget cached prompt features and drop any kept-loaded encoder (without calling its release hook)."""
    _cache.clear()
    _resident.clear()


def release_resident(release_hook: ReleaseHook | None = None) -> None:
    """Free a text encoder kept loaded by `keep_loaded=True` (its handle goes to `release_hook`)."""
    entries = list(_resident.values())
    _resident.clear()
    for _module, handle in entries:
        if release_hook is not None and handle is not None:
            release_hook(handle)


def encode_prompts(spec: TextEncoderSpec, prompts: Sequence[str], keep_loaded: bool = False,
                   on_step: Callable[[int, int], None] | None = None, load_hook: LoadHook | None = None,
                   release_hook: ReleaseHook | None = None,
                   output_device: torch.device | str = "cpu") -> TextFeatures:
    """Prompts → projected features: video [B, 1024, video_dim], audio [B, 1024, audio_dim], mask [B, 1024].

    Cached prompts skip Gemma entirely; the others go through one batched forward under inference mode. Outputs
    are fresh, ordinary tensors (copied out of inference mode) on `output_device`, with no autograd history.
    `load_hook(module, handle)` places the module for compute and returns a handle (it gets the previous handle
    back for a kept-loaded module, else None); `release_hook(handle)` is called when the module is freed: after
    this call unless `keep_loaded`. The engine then holds no reference to the module."""
    if not prompts:
        raise LTX25Error("prompt", "the prompt list", "empty", "at least one prompt")
    file_key = _file_key(spec)
    if not keep_loaded and _resident:  # switched off while every prompt is cached: free the encoder all the same
        release_resident(release_hook)
    texts = [p.strip() for p in prompts]
    results = {t: _cache[(file_key, t)] for t in texts if (file_key, t) in _cache}
    missing = list(dict.fromkeys(t for t in texts if t not in results))
    if missing:
        results.update(_encode_uncached(spec, file_key, missing, keep_loaded, on_step, load_hook, release_hook))
    for text in texts:  # refresh the LRU order and insert new entries
        _cache[(file_key, text)] = results[text]
        _cache.move_to_end((file_key, text))
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    video, audio, mask = (torch.cat([results[t][i] for t in texts]).to(output_device) for i in range(3))
    return TextFeatures(video, audio, mask, spec.info)


def _encode_uncached(spec: TextEncoderSpec, file_key: tuple, texts: list[str], keep_loaded: bool,
                     on_step, load_hook, release_hook) -> dict[str, tuple[torch.Tensor, ...]]:
    tokens = spec.tokenizer.encode(texts)
    if _resident and file_key not in _resident:  # another encoder is kept loaded: free it first
        release_resident(release_hook)
    module, handle = _resident.pop(file_key, (None, None))
    placed = False
    try:
        if module is None:
            module = load_text_encoder(spec)
        if load_hook is not None:
            handle = load_hook(module, handle)
        placed = True  # a hook that fails has freed the module itself: it is neither kept nor released again
        video, audio = run_encoder(module, tokens.ids, tokens.mask, on_step)
        # Copy each row out of inference mode: ordinary CPU tensors, safe to cache and to use in any mode later.
        return {t: (video[i:i + 1].to("cpu", copy=True), audio[i:i + 1].to("cpu", copy=True),
                    tokens.mask[i:i + 1].clone()) for i, t in enumerate(texts)}
    finally:
        if keep_loaded and placed:
            _resident[file_key] = (module, handle)
        elif placed and handle is not None and release_hook is not None:
            release_hook(handle)
        del module, handle
