"""The tiny transformer file: the shipped `config.transformer` at tiny sizes, randomly weighted, in the exact native
layout (`model.diffusion_model.*` DiT keys plus both `…_embeddings_connector.*` blocks, bf16, native metadata)."""
from __future__ import annotations

from typing import Any, Mapping

from ...ltx.dit.transformer import KEY_MAP, SHIPPED_CONFIG, LTX25Transformer, TransformerConfig
from ...ltx.release import GEMMA_VERSION, MODEL_VERSION, SHIPPED_SCHEDULER
from .common import TINY_DIMS, randomize_, save_native

TINY_WEIGHT_SCALE = 0.05  # large enough that each gotcha (AV gate, keyframe marker, …) moves the tiny output


def tiny_config_block() -> dict[str, Any]:
    """The shipped `config.transformer` with tiny sizes (TINY_DIMS): 2 DiT and 2 connector layers; the connector
    widths equal the cross-attention widths equal the text-feature widths."""
    dims = TINY_DIMS
    video_head, audio_head = dims["video_inner"] // dims["video_heads"], dims["audio_inner"] // dims["audio_heads"]
    return {**SHIPPED_CONFIG, "num_layers": 2, "num_attention_heads": dims["video_heads"],
            "attention_head_dim": video_head, "cross_attention_dim": dims["video_inner"],
            "caption_channels": dims["text_hidden"], "audio_num_attention_heads": dims["audio_heads"],
            "audio_attention_head_dim": audio_head, "audio_cross_attention_dim": dims["audio_inner"],
            "in_channels": dims["latent_channels"], "out_channels": dims["latent_channels"],
            "audio_in_channels": dims["audio_latent_channels"] * dims["audio_latent_bins"],
            "audio_out_channels": dims["audio_latent_channels"] * dims["audio_latent_bins"],
            "connector_num_layers": 2, "connector_num_attention_heads": dims["video_heads"],
            "connector_attention_head_dim": video_head, "audio_connector_attention_head_dim": audio_head}


def tiny_metadata(block: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Native transformer-file metadata around a `config.transformer` block (tiny by default)."""
    return {"config": {"transformer": dict(block or tiny_config_block()), "scheduler": dict(SHIPPED_SCHEDULER)},
            "model_version": MODEL_VERSION, "gemma_source_checkpoint": {"gemma_version": GEMMA_VERSION}}


def write_tiny(path: str, seed: int = 0) -> str:
    """The tiny transformer file, written to `path` (native metadata: config, model_version, Gemma tag)."""
    metadata = tiny_metadata()
    config = TransformerConfig.from_metadata(path, metadata)
    model = randomize_(LTX25Transformer(config), seed, "transformer", scale=TINY_WEIGHT_SCALE)
    return save_native(path, KEY_MAP.to_native(model.state_dict()), metadata)
