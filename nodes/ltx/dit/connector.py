"""The two LTX-2.5 embeddings connectors (docs/MODEL.md §4): projected Gemma features → the text context the DiT
cross-attends to. They live in the TRANSFORMER file (`model.diffusion_model.{video,audio}_embeddings_connector.*`);
the projection in front of them lives in the text-encoder file and has already run (`TextFeatures`).

Modules are diffusers' `LTX2ConnectorTransformer1d` (one per stream). diffusers' `LTX2TextConnectors` is not used:
it also builds the 188160→4096/2048 projections, which belong to the other file. The embeddings-processor glue is
ours and follows the reference order (ltx-core `EmbeddingsProcessor.create_embeddings`):
1. stable right-pad sort of the (left-padded) tokens, same permutation for both streams and the mask;
2. padded rows → learnable registers, row i gets register `i mod 128`; every position then attends;
3. 1-D split RoPE over `arange(1024) / connector_positional_embedding_max_pos[0]`, N gated blocks, final RMSNorm;
4. the reference's "binary mask" `connector_mask < 1e-6` is always all ones (the connector mask is all zeros
   once registers are in), so video is multiplied by ones and audio is not masked at all. Kept as is: masking
   would zero the register outputs the model was trained on.
diffusers' connector forward also front-aligns tokens (its own stable argsort) and fills registers; we do steps 1-2
ourselves and hand it an all-zero additive mask, which it reads as "all valid", so its reorder is the identity and
the reference's order of operations is ours, pinned by tests, whatever the library does internally. Checked equal
to the reference otherwise (blocks, gates, q/k RMSNorm over the inner dim, GELU-tanh FF with biases, final
weightless RMSNorm, eps 1e-6), except that diffusers applies the RoPE cos/sin in float32 where ltx-core first casts
them to the stream dtype: same math, less rounding. `causal_temporal_positioning` in the config is unused by both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from diffusers.pipelines.ltx2.connectors import LTX2ConnectorTransformer1d

from ..conditioning import Conditioning, TextFeatures
from ..errors import LTX25Error
from ..files.config import REQUIRED, config_field
from ..files.keymap import Rename

NUM_REGISTERS = 128          # not configurable in the reference; 1024 tokens = 8 × 128
CONNECTOR_ROPE_THETA = 10000.0  # the connector's own hard default: the config's positional_embedding_theta is NOT used
def positive_ints(where: str, metadata: Mapping[str, Any], path: str, length: int, default: Any = REQUIRED) -> tuple:
    """A list field of `length` positive numbers (max_pos lists) at `path` under `config`, as a tuple."""
    value = config_field(where, metadata, path, default, kind=(list, tuple))
    if len(value) != length or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                       for v in value):
        raise LTX25Error(where, f"config.{path}", repr(value), f"a list of {length} positive numbers")
    return tuple(value)


@dataclass(frozen=True)
class ConnectorConfig:
    """The connector fields of `config.transformer` (2.5 values in comments; ltx-core defaults in brackets)."""
    video_heads: int          # connector_num_attention_heads 32 [30]
    video_head_dim: int       # connector_attention_head_dim 128 [128]
    video_layers: int         # connector_num_layers 8 [2]
    audio_heads: int          # audio_connector_num_attention_heads (absent ⇒ the video value)
    audio_head_dim: int       # audio_connector_attention_head_dim 64
    audio_layers: int         # audio_connector_num_layers (absent ⇒ the video value)
    gated_attention: bool     # connector_apply_gated_attention true [false]
    max_pos: tuple            # connector_positional_embedding_max_pos [4096] — the code default [1] is a trap
    double_precision: bool    # frequencies_precision == "float64"
    rope_type: str = "split"

    @property
    def video_width(self) -> int:
        return self.video_heads * self.video_head_dim

    @property
    def audio_width(self) -> int:
        return self.audio_heads * self.audio_head_dim

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any]) -> "ConnectorConfig":
        """Parse the connector fields of the file's native `config.transformer`."""
        field = lambda key, *a, **k: config_field(where, metadata, f"transformer.{key}", *a, **k)  # noqa: E731
        get = lambda key, default, kind=int: field(key, default, kind=kind)  # noqa: E731
        video_heads, video_head_dim = get("connector_num_attention_heads", 30), get("connector_attention_head_dim", 128)
        video_layers = get("connector_num_layers", 2)
        # Fixed in the reference modules (no switch): refuse a file that asks for something else.
        field("connector_ff_bias", True, allowed=(True,))
        field("connector_norm_output", True, allowed=(True,))
        field("connector_num_learnable_registers", NUM_REGISTERS, allowed=(NUM_REGISTERS,))
        return cls(
            video_heads=video_heads, video_head_dim=video_head_dim, video_layers=video_layers,
            audio_heads=get("audio_connector_num_attention_heads", video_heads),
            audio_head_dim=get("audio_connector_attention_head_dim", video_head_dim),
            audio_layers=get("audio_connector_num_layers", video_layers),
            gated_attention=get("connector_apply_gated_attention", False, bool),
            # No default: ltx-core's [1] silently turns positions 0..1023 into angles 4096× too large.
            max_pos=positive_ints(where, metadata, "transformer.connector_positional_embedding_max_pos", 1),
            double_precision=field("frequencies_precision", "float32", allowed=("float64", "float32")) == "float64",
            rope_type=field("rope_type", "split", allowed=("split",)))


class LTX25Connectors(torch.nn.Module):
    """Both connectors: `.video` ([B, 1024, video_width]) and `.audio` ([B, 1024, audio_width])."""

    def __init__(self, config: ConnectorConfig) -> None:
        super().__init__()
        self.config = config
        common = dict(num_learnable_registers=NUM_REGISTERS, rope_base_seq_len=config.max_pos[0],
                      rope_theta=CONNECTOR_ROPE_THETA, rope_double_precision=config.double_precision, eps=1e-6,
                      rope_type=config.rope_type, gated_attention=config.gated_attention)
        self.video = LTX2ConnectorTransformer1d(num_attention_heads=config.video_heads,
                                                attention_head_dim=config.video_head_dim,
                                                num_layers=config.video_layers, **common)
        self.audio = LTX2ConnectorTransformer1d(num_attention_heads=config.audio_heads,
                                                attention_head_dim=config.audio_head_dim,
                                                num_layers=config.audio_layers, **common)


# Native → module names, applied in order (each row sees the previous rows' output; `to_native` runs them
# backwards). `q_norm/k_norm → norm_q/norm_k` is shared with the DiT and lives in its table.
CONNECTOR_RENAMES = (
    Rename("model.diffusion_model.video_embeddings_connector", "connectors.video"),
    Rename("model.diffusion_model.audio_embeddings_connector", "connectors.audio"),
    Rename("connectors.video.transformer_1d_blocks", "connectors.video.transformer_blocks"),
    Rename("connectors.audio.transformer_1d_blocks", "connectors.audio.transformer_blocks"),
)
CONNECTOR_PREFIXES = ("model.diffusion_model.video_embeddings_connector.",
                      "model.diffusion_model.audio_embeddings_connector.")


def right_pad_order(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mask `[B, L]` (1 = valid) → (order `[B, L]`, reordered mask): valid tokens first in their original order,
    pads last (stable descending argsort). Identity on an already right-padded mask."""
    binary = (mask > 0).to(torch.int32)
    order = torch.argsort(binary, dim=-1, descending=True, stable=True)
    return order, torch.gather(binary, 1, order)


def apply_order(features: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Reorder `[B, L, D]` tokens by `order` `[B, L]`."""
    return torch.gather(features, 1, order.unsqueeze(-1).expand_as(features))


def fill_registers(hidden: torch.Tensor, mask: torch.Tensor, registers: torch.Tensor) -> torch.Tensor:
    """Right-padded `[B, L, D]` + mask `[B, L]` → padded rows replaced by `registers` `[R, D]` tiled along the
    sequence (row i gets register `i mod R`); `L % R == 0` is required. The blend `m·x + (1−m)·reg` is the
    reference's arithmetic."""
    length, count = hidden.shape[1], registers.shape[0]
    if length % count:
        raise LTX25Error("text features", "the token count", length, f"a multiple of {count} (the connector's "
                         "learnable registers)", "Prompts are padded to 1024 tokens by the text encoder.")
    keep = mask.unsqueeze(-1).to(hidden.dtype)
    return keep * hidden + (1 - keep) * registers.to(hidden.dtype).repeat(length // count, 1)


def _connect(connector: LTX2ConnectorTransformer1d, hidden: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Registers in, then diffusers' RoPE + blocks + final norm under an all-zero additive mask (registers make
    every position valid). Returns (encoding `[B, L, D]`, the connector's additive mask `[B, 1, 1, L]`)."""
    hidden = fill_registers(hidden, mask, connector.learnable_registers)
    return connector(hidden, hidden.new_zeros(hidden.shape[0], 1, 1, hidden.shape[1]))


def _check_features(features: TextFeatures, config: ConnectorConfig) -> None:
    b, length = features.mask.shape
    for name, tensor, width in (("video", features.video, config.video_width),
                                ("audio", features.audio, config.audio_width)):
        if tuple(tensor.shape) != (b, length, width):
            raise LTX25Error("text_features", f"the {name} feature shape", tuple(tensor.shape), (b, length, width),
                             "The text encoder's projection does not match this transformer's connectors.")


def run_connectors(model: torch.nn.Module, features: TextFeatures) -> Conditioning:
    """Projected, left-padded text features → the DiT's text context (docs/MODEL.md §4.1).

    `model` carries `.connectors` (`LTX25Connectors`); features video `[B, L, Dv]`, audio `[B, L, Da]`, mask
    `[B, L]`. Returns `Conditioning` with video `[B, L, Dv]`, audio `[B, L, Da]` in the weights' dtype, on the
    features' device.
    """
    connectors: LTX25Connectors = model.connectors
    _check_features(features, connectors.config)
    weight = connectors.video.learnable_registers
    with torch.inference_mode():
        order, mask = right_pad_order(features.mask.to(weight.device))
        video = apply_order(features.video.to(weight.device, weight.dtype), order)
        audio = apply_order(features.audio.to(weight.device, weight.dtype), order)
        video, video_mask = _connect(connectors.video, video, mask)
        audio, _ = _connect(connectors.audio, audio, mask)
        # The reference's `_to_binary_mask`: always all ones (see module docstring); video only, audio never.
        binary = (video_mask < 1e-6).to(torch.int64).reshape(video.shape[0], video.shape[1], 1)
        video = video * binary
        out = features.video.device
        return Conditioning(video=video.to(out), audio=audio.to(out))


def working_memory(model: torch.nn.Module, features: TextFeatures) -> int:
    """Bytes `run_connectors` needs beyond the weights: tokens × width × ~12 live values (q/k/v, 4× FF hidden,
    residual) per stream at the weights' element size, plus the L×L attention scores per head."""
    config: ConnectorConfig = model.connectors.config
    b, length = features.mask.shape
    itemsize = model.connectors.video.learnable_registers.element_size()
    return b * length * ((config.video_width + config.audio_width) * 12
                         + (config.video_heads + config.audio_heads) * length) * itemsize
