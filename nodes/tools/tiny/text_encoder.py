"""The tiny Gemma-4 text-encoder file: the shipped layout (Comfy-flat keys, the unused towers, tokenizer bytes, HF
sidecars, `gemma_config` metadata) at tiny sizes, with a small deterministic BPE tokenizer (byte fallback)."""
from __future__ import annotations

import copy
import json

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers.models.gemma4_unified import configuration_gemma4_unified as gemma_config
from transformers.models.gemma4_unified import modeling_gemma4_unified as gemma_modeling

from ...ltx.release import GEMMA_VERSION
from ...ltx.text.encoder import ASSET_PREFIX, KEY_MAP, TOKENIZER_KEY, TextEncoderModule
from .common import TINY_DIMS, generator, randomize_, save_native

TINY_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0, 1, 2, 3 as in Gemma
_TINY_CORPUS = (
    "A red fox runs through a snowy forest at dawn, the camera tracking low beside it.",
    "The quick brown fox jumps over the lazy dog while the wind whistles in the trees.",
    "A woman speaks softly in a quiet kitchen; rain taps on the window and a kettle hisses.",
    "Close-up of waves breaking on black sand, slow motion, golden evening light.",
    "A crowded street market at night with neon signs, music and people talking.",
)
TINY_TOKENIZER_CONFIG = {
    "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
    "padding_side": "left", "tokenizer_class": "GemmaTokenizer", "processor_class": "Gemma4UnifiedProcessor",
    "model_max_length": 1000000000000000019884624838656,
}


def _sentencepiece_like(tokenizer: Tokenizer) -> Tokenizer:
    # Gemma style: spaces become "▁" and stay attached to the following word.
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    return tokenizer


def build_tiny_tokenizer(merges_vocab: int = 200) -> Tokenizer:
    """A small real BPE with byte fallback (ids: 4 specials, 256 `<0xNN>` bytes, then learned pieces).

    Deterministic: BPE training on a fixed corpus has a fixed merge order."""
    learner = _sentencepiece_like(Tokenizer(models.BPE()))
    alphabet = [chr(c) for c in range(33, 127)] + ["▁"]
    learner.train_from_iterator(_TINY_CORPUS, trainers.BpeTrainer(
        vocab_size=merges_vocab, initial_alphabet=alphabet, show_progress=False))
    learned = json.loads(learner.to_str())["model"]
    vocab = {token: i for i, token in enumerate(TINY_SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(TINY_SPECIALS) + b for b in range(256)})
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = _sentencepiece_like(Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token="<unk>")))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIALS])
    return tokenizer


def tiny_gemma_config(vocab_size: int, gemma_version: str = GEMMA_VERSION) -> dict:
    """HF config JSON in the shipped layout (model_type gemma4_unified, top-level gemma_version) at tiny sizes;
    every non-size value is the real one (k_eq_v, layer pattern, RoPE per layer type, eps, special ids)."""
    layers = TINY_DIMS["text_layers"]
    text = dict(
        hidden_size=TINY_DIMS["text_hidden"], num_hidden_layers=layers, intermediate_size=128,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, vocab_size=vocab_size, sliding_window=1024,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, attention_bias=False, num_kv_shared_layers=0,
        hidden_size_per_layer_input=0,
        layer_types=["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(layers)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1_000_000.0}})
    vision = dict(patch_size=2, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=8, output_proj_dims=16)
    config = gemma_config.Gemma4UnifiedConfig(text_config=text, vision_config=vision,
                                              audio_config=dict(audio_embed_dim=8)).to_dict()
    config["architectures"] = ["Gemma4UnifiedForConditionalGeneration"]
    config["gemma_version"] = gemma_version
    return config


def _tiny_towers(config: gemma_config.Gemma4UnifiedConfig, seed: int) -> dict[str, torch.Tensor]:
    """The image/audio embedder tensors under their Comfy-flat names (the loader drops them)."""
    vision = gemma_modeling.Gemma4UnifiedVisionEmbedder(config.vision_config, config.text_config)
    audio = gemma_modeling.Gemma4UnifiedMultimodalEmbedder(config.audio_config, config.text_config)
    randomize_(vision, seed, "text_encoder.vision")
    randomize_(audio, seed, "text_encoder.audio")
    out = {("multi_modal_projector." + k[len("multimodal_embedder."):] if k.startswith("multimodal_embedder.")
            else "vision_model." + k): v for k, v in vision.state_dict().items()}
    out.update({"audio_projector." + k: v for k, v in audio.state_dict().items()})
    return out


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def write_tiny(path: str, seed: int, *, gemma_version: str = GEMMA_VERSION) -> str:
    """The tiny text-encoder file, written to `path`. `gemma_version` other than the shipped tag makes a mismatched
    pair for tests."""
    tokenizer = build_tiny_tokenizer()
    raw_config = tiny_gemma_config(tokenizer.get_vocab_size(), gemma_version)
    config = gemma_config.Gemma4UnifiedConfig.from_dict(copy.deepcopy(raw_config))
    module = TextEncoderModule(config, TINY_DIMS["video_inner"], TINY_DIMS["audio_inner"])
    randomize_(module, seed, "text_encoder")
    g = generator(seed, "text_encoder.layer_scalar")
    for layer in module.gemma.language_model.layers:  # real values lie in 0.005–0.93; near 0 would zero the stream
        layer.layer_scalar.copy_(torch.rand(1, generator=g) * 0.6 + 0.3)
    tensors = KEY_MAP.to_native(module.state_dict())
    tensors.update(_tiny_towers(config, seed))
    tensors[TOKENIZER_KEY] = _bytes_tensor(tokenizer.to_str().encode())
    sidecars = {
        "tokenizer_config.json": json.dumps(TINY_TOKENIZER_CONFIG, indent=2),
        "processor_config.json": json.dumps({"processor_class": "Gemma4UnifiedProcessor"}, indent=2),
        "chat_template.jinja": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                               "{{ m['content'] }}<end_of_turn>\n{% endfor %}",
        "generation_config.json": json.dumps({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}, indent=2),
    }
    tensors.update({ASSET_PREFIX + name: _bytes_tensor(text.encode()) for name, text in sidecars.items()})
    return save_native(path, tensors, {"gemma_config": raw_config, "format": "pt"})
