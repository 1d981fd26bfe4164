"""Prompt encoding (docs/MODEL.md §3): the tiny Gemma-4 text-encoder file, strict loading, tokenization (BOS, left
padding, truncation), the 49-state forward with mask-blind positions, feature extractor V2 (flatten order,
per-stream rescale), the inference-mode lifecycle of issue #310, the prompt cache, and the encode node."""
from __future__ import annotations

import copy
import gc
import logging
import os
import weakref

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, processors

from nodes.comfy import bridge
from nodes.ltx.files import assets
from nodes.ltx.files import keymap
from nodes.ltx.text import encoder as te
from nodes.ltx.files.assets import AssetInfo, Kind
from nodes.ltx.errors import LTX25Error
from nodes.ltx.text.tokenizer import GemmaTokenizer
from nodes.ltx.text.projection import TextProjection, normalize_and_flatten, stream_scale
from nodes.ltx.release import GEMMA_VERSION
from nodes.tools.tiny import text_encoder as tiny_text_encoder
from nodes.tools.tiny.common import TINY_DIMS
from nodes.comfy.text import LTX25EncodePrompt, split_prompts

TOWERS = 11  # vision_model.* (9) + multi_modal_projector (1) + audio_projector (1), as in the real file


@pytest.fixture(scope="module")
def path(tiny_file) -> str:
    return tiny_file("text_encoder")


@pytest.fixture(scope="module")
def spec(path) -> te.TextEncoderSpec:
    return te.TextEncoderSpec.from_file(path, torch.bfloat16)


@pytest.fixture(scope="module")
def module(spec) -> te.TextEncoderModule:
    return te.load_text_encoder(spec)


@pytest.fixture(autouse=True)
def fresh_caches():
    te.clear_caches()
    yield
    te.clear_caches()


@pytest.fixture
def count_loads(monkeypatch):
    """Counts `load_text_encoder` calls and keeps a weakref to every module built."""
    built: list[weakref.ref] = []
    real = te.load_text_encoder

    def counting(spec):
        module = real(spec)
        built.append(weakref.ref(module))
        return module

    monkeypatch.setattr(te, "load_text_encoder", counting)
    return built


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# ---------------------------------------------------------------------------------------------------- file + loading
def test_tiny_file_has_the_native_layout(path):
    """Comfy-flat Gemma keys, the 11 tower tensors, tokenizer bytes, the four HF sidecars and `gemma_config`
    metadata: what the loader must handle in the released file."""
    header = assets.read_header(path)
    keys = set(header.tensors)
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.layer_scalar",
            "text_embedding_projection.video_aggregate_embed.bias", "tokenizer_json"} <= keys
    assert sum(k.startswith(("vision_model.", "multi_modal_projector.", "audio_projector.")) for k in keys) == TOWERS
    assert {f"hf_asset__{n}" for n in ("tokenizer_config.json", "processor_config.json", "chat_template.jinja",
                                       "generation_config.json")} <= keys
    assert header.tensors["tokenizer_json"].dtype == "U8"
    config = header.metadata["gemma_config"]
    assert config["model_type"] == "gemma4_unified" and config["gemma_version"] == GEMMA_VERSION
    assert header.metadata["format"] == "pt"
    # real tensor inventory facts (§3.3): global layers (idx % 6 == 5) have no v_proj, sliding ones do
    assert "model.layers.5.self_attn.v_proj.weight" not in keys and "model.layers.4.self_attn.v_proj.weight" in keys
    assert header.tensors["model.layers.5.self_attn.k_norm.weight"].shape == (32,)  # global_head_dim
    assert header.tensors["text_embedding_projection.audio_aggregate_embed.weight"].shape == (
        TINY_DIMS["audio_inner"], TINY_DIMS["text_hidden"] * 7)


def test_tiny_writer_is_deterministic(tmp_path):
    """Same seed ⇒ same metadata and tensors (tokenizer training included), so cached tiny sets stay valid.
    (Not the raw bytes: safetensors writes metadata keys in hash-map order.)"""
    paths = [tiny_text_encoder.write_tiny(str(tmp_path / f"{name}.safetensors"), 3) for name in "ab"]
    headers = [assets.read_header(p) for p in paths]
    assert headers[0].metadata == headers[1].metadata and headers[0].tensors == headers[1].tensors
    with safe_open(paths[0], "pt") as fa, safe_open(paths[1], "pt") as fb:
        for key in fa.keys():
            assert torch.equal(fa.get_tensor(key), fb.get_tensor(key)), key


def test_tiny_file_loads_with_full_coverage(spec, module):
    """Every module tensor comes from the file, nothing stays on meta, and exactly the towers, the tokenizer and
    the sidecars are dropped (a real-file key the map forgets would fail loudly, not load at random)."""
    native = assets.read_state_dict(spec.path)
    mapped, dropped = te.KEY_MAP.apply(native)
    assert set(mapped) == set(module.state_dict())
    assert len(dropped) == TOWERS + 1 + 4, sorted(dropped)
    assert not [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    assert not any(p.requires_grad for p in module.parameters())
    torch.testing.assert_close(module.gemma.language_model.layers[2].layer_scalar, native["model.layers.2.layer_scalar"])
    assert "lm_head.weight" not in module.state_dict()  # tied head: never built, the encoder stops at hidden states


@pytest.mark.parametrize("row", [*te.KEY_MAP.renames, *te.KEY_MAP.drops], ids=lambda r: str(getattr(r, "native", None)
                                                                                           or r.pattern))
def test_every_key_map_row_is_needed(spec, row):
    """Removing any rename or drop row makes strict loading fail: the table has no dead rows and no gaps."""
    smaller = keymap.KeyMap("reduced", tuple(r for r in te.KEY_MAP.renames if r is not row), (),
                            tuple(d for d in te.KEY_MAP.drops if d is not row))
    native = assets.read_state_dict(spec.path)
    with pytest.raises(LTX25Error, match="key coverage"):
        keymap.load_strict(spec.path, lambda: te.TextEncoderModule(spec.config, spec.video_dim, spec.audio_dim),
                           native, smaller, spec.dtype, te.init_buffers)


def test_spec_reads_only_the_tokenizer_tensors(path, monkeypatch):
    """The loader node must stay light: building the spec reads the tokenizer bytes and its config, no weights."""
    read: list[str] = []

    class Recording:
        def __init__(self, *args, **kwargs):
            self.inner = safe_open(*args, **kwargs)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def get_tensor(self, key):
            read.append(key)
            return self.inner.get_tensor(key)

    monkeypatch.setattr(te, "safe_open", Recording)
    spec = te.TextEncoderSpec.from_file(path)
    assert sorted(read) == ["hf_asset__tokenizer_config.json", "tokenizer_json"]
    assert (spec.video_dim, spec.audio_dim) == (TINY_DIMS["video_inner"], TINY_DIMS["audio_inner"])


def test_gemma_config_comes_from_the_file(spec):
    """Layer pattern, K=V global attention and the per-type RoPE are read from `gemma_config` (real values)."""
    text = spec.text_config
    assert text.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert text.attention_k_eq_v is True and text.global_head_dim == 32
    assert text.rope_parameters["full_attention"] == {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                      "rope_theta": 1_000_000.0}
    assert text.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0


def test_gemma4_traps_hold_in_the_transformers_implementation(module):
    """§13 item 14, pinned against transformers upgrades: attention scale 1 (folded into k_norm), RMSNorm
    multiplies by the weight itself (not 1 + w), global layers reuse K for V, weightless v_norm."""
    attn = module.gemma.language_model.layers[5].self_attn
    assert attn.scaling == 1.0 and attn.v_proj is None and not hasattr(attn.v_norm, "weight")
    norm = copy.deepcopy(module.gemma.language_model.norm).float()
    with torch.no_grad():
        norm.weight.fill_(2.0)
    x = torch.randn(3, 64)
    torch.testing.assert_close(norm(x), 2.0 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_other_gemma_models_are_refused_naming_the_key():
    """A Gemma-3 (LTX-2.0/2.3) config in the slot must say which key is wrong."""
    with pytest.raises(LTX25Error, match="gemma_config.model_type"):
        te.parse_gemma_config("te.safetensors", {"model_type": "gemma3"})


def test_wrong_gemma_version_is_detectable(tmp_path, spec):
    """A text encoder from another Gemma fine-tune carries another `gemma_version`; the pairing check refuses it."""
    other = tiny_text_encoder.write_tiny(str(tmp_path / "other.safetensors"), 0, gemma_version="gemma4-12b-ltx-v0")
    transformer = AssetInfo("t.safetensors", Kind.TRANSFORMER, "2.5.0", GEMMA_VERSION, {}, None, None)
    assets.check_gemma_pairing(transformer, spec.info)
    with pytest.raises(LTX25Error, match="gemma4-12b-ltx-v0"):
        assets.check_gemma_pairing(transformer, te.TextEncoderSpec.from_file(other).info)


@pytest.mark.parametrize("sidecar, found", [(b'{"bos_token": "\xff"}', "unreadable"), (b"[1, 2]", "a JSON list")])
def test_a_corrupt_tokenizer_sidecar_is_refused_naming_the_file_and_tensor(path, tmp_path, sidecar, found):
    """Bytes that are not UTF-8 JSON (a UnicodeDecodeError before) or JSON that is not an object, in the file's
    tokenizer_config.json tensor: an LTX25Error naming the file and the tensor, with what to do."""
    from safetensors.torch import load_file, save_file
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    tensors[te.ASSET_PREFIX + "tokenizer_config.json"] = torch.tensor(list(sidecar), dtype=torch.uint8)
    damaged = str(tmp_path / "damaged.safetensors")
    save_file(tensors, damaged, metadata)
    with pytest.raises(LTX25Error, match=f"tensor hf_asset__tokenizer_config.json is {found}") as error:
        te.TextEncoderSpec.from_file(damaged)
    assert damaged in str(error.value) and "re-download" in str(error.value)


def test_a_prompt_with_a_lone_surrogate_is_refused_naming_the_character(spec):
    """Text with half of a UTF-16 pair (an emoji cut in two) cannot be tokenized (a bare TypeError from the
    tokenizer before): the node names its prompt input, the character and where it is, before Gemma loads."""
    with pytest.raises(LTX25Error, match=r"LTX25EncodePrompt.prompt: .*'\\ud83e' at character 8") as error:
        LTX25EncodePrompt().encode(spec, "a fox \n\n\ud83e in the snow")
    assert "valid Unicode" in str(error.value)


def test_a_gemma_mismatch_is_refused_from_the_graph_before_the_encode(tiny_models, tmp_path, path, count_loads):
    """Encode Prompt finds in the graph (ComfyUI's hidden PROMPT and UNIQUE_ID) the transformer its features will
    meet at a Connector, through a LoRA loader, and refuses a text encoder of another Gemma version before Gemma is
    loaded — the Connector found it only after the 12B encode. The paired encoder encodes; a graph without a
    Connector, or no graph (a script), is left to the Connector's own check."""
    from nodes.comfy.pairing import transformer_files_fed
    from nodes.tools.tiny import OFFICIAL_FILES
    transformer_file = OFFICIAL_FILES["transformer"][1]
    graph = {"1": {"class_type": "LTX25TransformerLoader", "inputs": {"transformer_file": transformer_file}},
             "3": {"class_type": "LTX25EncodePrompt", "inputs": {"text_encoder": ["2", 0], "prompt": "a fox"}},
             "6": {"class_type": "LTX25LoraLoader", "inputs": {"model": ["1", 0]}},
             "4": {"class_type": "LTX25Connector", "inputs": {"model": ["6", 0], "text_features": ["3", 0]}}}
    assert transformer_files_fed(graph, "3") == [transformer_file] and transformer_files_fed(graph, "4") == []
    other = te.TextEncoderSpec.from_file(
        tiny_text_encoder.write_tiny(str(tmp_path / "other.safetensors"), 0, gemma_version="gemma4-12b-ltx-v0"))
    with pytest.raises(LTX25Error, match="gemma_version is gemma4-12b-ltx-v0") as error:
        LTX25EncodePrompt().encode(other, "a fox", graph=graph, unique_id="3")
    assert transformer_file in str(error.value) and count_loads == [], error.value
    no_connector = {k: v for k, v in graph.items() if k != "4"}
    for graph_given, node in ((no_connector, "3"), (None, None)):
        LTX25EncodePrompt().encode(other, "a fox", graph=graph_given, unique_id=node)
    (features,) = LTX25EncodePrompt().encode(te.TextEncoderSpec.from_file(path), "a fox", graph=graph, unique_id="3")
    assert features.video.shape[0] == 1 and len(count_loads) == 2


# ---------------------------------------------------------------------------------------------------- tokenization
def test_bos_is_prepended_exactly_once_and_prompts_are_left_padded(spec):
    """Gemma 4's tokenizer emits no BOS: we add one; a prompt already starting with BOS gets none more; the
    padding goes on the LEFT (mask 0 … 0 1 … 1) with pad id 0."""
    tok = spec.tokenizer
    batch = tok.encode(["  a red fox  ", "<bos>a red fox"])
    n = int(batch.mask[0].sum())
    assert batch.ids.shape == (2, 1024) and n > 1
    for row in range(2):
        assert batch.mask[row].tolist() == [0] * (1024 - n) + [1] * n, "left padding, same length for both"
        assert batch.ids[row, -n] == 2 and (batch.ids[row, -n:] == 2).sum() == 1, batch.ids[row, -n:].tolist()
        assert (batch.ids[row, :-n] == 0).all()
    assert batch.ids[0].tolist() == batch.ids[1].tolist()  # strip + BOS rule give the same ids


def test_bos_from_a_gemma3_style_post_processor_is_not_doubled(spec):
    """Gemma 3 tokenizers add BOS themselves (post-processor); the rule 'prepend only when missing' keeps one."""
    raw = Tokenizer.from_str(spec.tokenizer.tokenizer.to_str())
    raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok = GemmaTokenizer(raw, spec.tokenizer.bos_id, spec.tokenizer.pad_id)
    ids, _ = tok.prompt_ids("a red fox")
    assert ids[0] == 2 and ids.count(2) == 1 and ids == spec.tokenizer.prompt_ids("a red fox")[0]


def test_empty_prompt_is_bos_only(spec):
    """Like the reference, the empty prompt is encoded, not refused: BOS then 1023 pads."""
    batch = spec.tokenizer.encode(["   "])
    assert int(batch.mask.sum()) == 1 and batch.ids[0, -1] == 2 and batch.dropped == (0,)


def test_over_long_prompt_keeps_its_start_and_warns_with_the_dropped_count(spec, caplog):
    """1024 tokens with BOS at most: the end of a long prompt is cut and the warning says how many tokens."""
    words = "fox " * 1500
    full = spec.tokenizer.tokenizer.encode(words.strip()).ids
    with caplog.at_level(logging.WARNING, logger="nodes.ltx.text.tokenizer"):
        batch = spec.tokenizer.encode([words])
    expected = len(full) + 1 - 1024
    assert batch.dropped == (expected,) and batch.mask.all()
    assert batch.ids[0].tolist() == [2] + full[:1023]
    assert f"last {expected} tokens were dropped" in caplog.text, caplog.text


# ---------------------------------------------------------------------------------------------------- forward
def test_hidden_states_are_embeddings_plus_every_layer_with_the_last_post_norm(spec, module):
    """layers + 1 states (real 49): h[0] = embeddings × sqrt(hidden), h[-1] = final norm of the last layer."""
    tokens = spec.tokenizer.encode(["a red fox"])
    captured = {}
    hook = module.gemma.language_model.layers[-1].register_forward_hook(lambda m, i, o: captured.update(out=o))
    with torch.inference_mode():
        out = module.gemma(input_ids=tokens.ids, attention_mask=tokens.mask, output_hidden_states=True,
                           use_cache=False)
        embed = module.gemma.language_model.embed_tokens.weight[tokens.ids] * torch.tensor(64 ** 0.5).bfloat16()
        final = module.gemma.language_model.norm(captured["out"])
    hook.remove()
    assert len(out.hidden_states) == spec.num_states == module.text_embedding_projection.num_states == 7
    assert _diff(out.hidden_states[0], embed) == 0.0
    assert _diff(out.hidden_states[-1], final) == 0.0


def test_positions_are_mask_blind(spec, module):
    """The reference passes no position ids: left-padded prompts sit at 1024-n … 1023. Positions counted from
    the mask give other features, so 'fixing' this breaks parity."""
    tokens = spec.tokenizer.encode(["a red fox runs through the snowy forest"])
    ours = te.run_encoder(module, tokens.ids, tokens.mask)[0]
    with torch.inference_mode():
        def video(positions):
            out = module.gemma(input_ids=tokens.ids, attention_mask=tokens.mask, position_ids=positions,
                               output_hidden_states=True, use_cache=False)
            return module.text_embedding_projection(list(out.hidden_states), tokens.mask)[0]
        default = video(torch.arange(1024)[None])
        from_mask = video((tokens.mask.cumsum(-1) - 1).clamp(min=0))
    valid = tokens.mask[0].bool()
    assert _diff(ours, default) == 0.0
    assert _diff(ours[0, valid], from_mask[0, valid]) > 1e-2


def test_flatten_is_hidden_major_layer_minor():
    """Element (d, l) of the normed stack lands at index d·L + l, padded tokens are zero."""
    b, t, d, n = 2, 5, 4, 3
    hidden = [torch.randn(b, t, d) for _ in range(n)]
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    flat = normalize_and_flatten(list(hidden), mask)
    for layer in range(n):
        normed = hidden[layer] / hidden[layer].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        for dim in range(d):
            got = flat[..., dim * n + layer]
            torch.testing.assert_close(got, normed[..., dim] * mask, msg=f"(d={dim}, l={layer})")


def test_per_stream_rescale_is_sqrt_out_over_hidden():
    """video Linear sees normed × sqrt(video_dim / hidden), audio × sqrt(audio_dim / hidden) (real 4096/3840 and
    2048/3840); dims chosen so that swapping or inverting the ratio shows."""
    proj = TextProjection(hidden_size=8, num_states=2, video_dim=18, audio_dim=2)
    flat = torch.randn(1, 3, 16)
    video, audio = proj.project(flat)
    torch.testing.assert_close(video, proj.video_aggregate_embed(flat * (18 / 8) ** 0.5))
    torch.testing.assert_close(audio, proj.audio_aggregate_embed(flat * 0.5))
    assert stream_scale(4096, 3840) == (4096 / 3840) ** 0.5


def test_encoded_features_match_a_hand_computed_projection(spec, module):
    """End to end on the tiny file: features = bias + Σ_{d,l} W[o, d, l] · rms_norm(h_l)[d] · sqrt(out/hidden),
    with the weight viewed as [out, D, L] (hidden-major), padded rows zero."""
    features = te.encode_prompts(spec, ["a red fox"])
    tokens = spec.tokenizer.encode(["a red fox"])
    with torch.inference_mode():
        states = module.gemma(input_ids=tokens.ids, attention_mask=tokens.mask, output_hidden_states=True,
                              use_cache=False).hidden_states
    normed = torch.stack([h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6) for h in states],
                         dim=-1) * tokens.mask[..., None, None]  # [B, T, D, L]
    for stream, got in (("video", features.video), ("audio", features.audio)):
        linear = getattr(module.text_embedding_projection, f"{stream}_aggregate_embed")
        weight = linear.weight.float().view(linear.out_features, 64, 7)
        want = torch.einsum("btdl,odl->bto", normed, weight) * (linear.out_features / 64) ** 0.5 + linear.bias.float()
        assert _diff(got, want) < 0.05 * want.abs().max().item(), f"{stream}: {_diff(got, want)}"
    assert features.mask.tolist() == tokens.mask.tolist()


def test_batch_of_two_equals_two_single_runs(spec):
    """One fused [2, 1024] forward gives each prompt what it gets alone (left padding keeps rows independent)."""
    both = te.encode_prompts(spec, ["a red fox", "rain on a window at night, a kettle hisses"])
    te.clear_caches()
    first = te.encode_prompts(spec, ["a red fox"])
    second = te.encode_prompts(spec, ["rain on a window at night, a kettle hisses"])
    for name in ("video", "audio"):
        alone = torch.cat([getattr(first, name), getattr(second, name)])
        assert _diff(getattr(both, name), alone) < 2e-2, f"{name}: {_diff(getattr(both, name), alone)}"
    assert both.video.shape == (2, 1024, TINY_DIMS["video_inner"])
    assert both.audio.shape == (2, 1024, TINY_DIMS["audio_inner"])


def test_cache_hit_skips_loading_gemma(spec, count_loads):
    """A re-run with the same prompt must not read or build Gemma; a new prompt loads it again (freed between)."""
    a = te.encode_prompts(spec, ["a red fox"])
    b = te.encode_prompts(spec, ["  a red fox "])
    assert len(count_loads) == 1 and torch.equal(a.video, b.video)
    te.encode_prompts(spec, ["a red fox", "a blue bird"])
    assert len(count_loads) == 2, "only the new prompt is encoded, in one load"


# ---------------------------------------------------------------------------------------------------- lifecycle
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS is read from /proc")
def test_node_with_grad_enabled_leaves_no_graph_and_frees_gemma(spec, count_loads, monkeypatch):
    """Issue #310: with autograd on and parameters requiring grad (as the reference loads them), outputs must
    carry no graph, the Gemma module must be gone when the node returns, and memory must come back."""
    real = te.load_text_encoder
    monkeypatch.setattr(te, "load_text_encoder", lambda s: real(s).requires_grad_(True))
    node, others = LTX25EncodePrompt(), bridge.loaded_model_count()  # other tests may leave models registered
    with torch.enable_grad():
        node.encode(spec, "warm up the allocator")
        gc.collect()
        baseline = _rss()
        for i in range(3):
            (features,) = node.encode(spec, f"a red fox number {i}\n---\na blue bird number {i}")
            for tensor in (features.video, features.audio, features.mask):
                assert tensor.grad_fn is None and not tensor.requires_grad and not tensor.is_inference()
            assert features.video.shape[0] == 2
            assert count_loads[-1]() is None, "the Gemma module outlived the node call"
    assert bridge.loaded_model_count() == others, "the encoder stayed registered with model management"
    del features
    gc.collect()
    grown = _rss() - baseline
    assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 3 encodes"


def test_keep_loaded_keeps_gemma_until_released(spec, count_loads):
    """keep_loaded: the next new prompt reuses the module (no second load); releasing frees it."""
    node, others = LTX25EncodePrompt(), bridge.loaded_model_count()
    node.encode(spec, "a red fox", keep_loaded=True)
    node.encode(spec, "a blue bird", keep_loaded=True)
    assert len(count_loads) == 1 and count_loads[0]() is not None
    assert bridge.loaded_model_count() == others + 1
    te.release_resident(bridge.unload_model)
    gc.collect()
    assert count_loads[0]() is None and bridge.loaded_model_count() == others


def test_turning_keep_loaded_off_frees_gemma_even_on_a_cache_hit(spec, count_loads):
    """A kept encoder must go as soon as keep_loaded is off, also when the prompt is cached and Gemma never runs."""
    node, others = LTX25EncodePrompt(), bridge.loaded_model_count()
    node.encode(spec, "a green lizard", keep_loaded=True)
    node.encode(spec, "a green lizard", keep_loaded=False)
    gc.collect()
    assert len(count_loads) == 1 and count_loads[0]() is None and bridge.loaded_model_count() == others


def test_a_kept_encoder_whose_placement_fails_is_loaded_afresh_next_time(spec, count_loads, monkeypatch):
    """keep_loaded, and the next placement fails (out of memory): the node frees the module where it is, so it
    must not be kept for the next prompt: kept weightless, every later encode would fail ("Cannot copy out of meta
    tensor") until keep_loaded was turned off."""
    node = LTX25EncodePrompt()
    node.encode(spec, "a red fox", keep_loaded=True)
    load = bridge.load_models

    def out_of_memory(patchers, memory_required=0):
        raise torch.OutOfMemoryError("the test's card is full")
    monkeypatch.setattr(bridge, "load_models", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        node.encode(spec, "a blue bird", keep_loaded=True)
    monkeypatch.setattr(bridge, "load_models", load)
    got = node.encode(spec, "a white owl", keep_loaded=True)[0]
    te.release_resident(bridge.unload_model)
    te.clear_caches()
    want = node.encode(spec, "a white owl")[0]
    assert torch.equal(got.video, want.video) and torch.equal(got.audio, want.audio)


def test_interrupt_mid_forward_still_frees_gemma(spec, count_loads):
    """An interrupt raised from the progress callback must not leave the 24 GB module behind."""
    def interrupt(done, total):
        raise bridge.InterruptError("stop")

    with pytest.raises(bridge.InterruptError):
        te.encode_prompts(spec, ["a red fox"], on_step=interrupt)
    gc.collect()
    assert count_loads[0]() is None


# ---------------------------------------------------------------------------------------------------- node
def test_prompt_separator_convention():
    """A line holding only --- separates prompts; blank parts vanish; an empty text is one empty prompt."""
    assert split_prompts("a fox\n---\n  a bird \n --- \n\n---\n") == ["a fox", "a bird"]
    assert split_prompts("a fox --- not a separator") == ["a fox --- not a separator"]
    assert split_prompts("") == [""]


def test_node_declares_tooltips_and_the_feature_type():
    """Every input has a tooltip; the output is the type the connector takes."""
    inputs = LTX25EncodePrompt.INPUT_TYPES()["required"]
    assert set(inputs) == {"text_encoder", "prompt", "keep_loaded"}
    assert all(spec_[1].get("tooltip") for spec_ in inputs.values())
    assert inputs["prompt"][1]["multiline"] and inputs["keep_loaded"][1]["default"] is False
    assert LTX25EncodePrompt.RETURN_TYPES == ("LTX25_TEXT_FEATURES",)


def test_node_refuses_a_missing_text_encoder():
    """A wrong or missing input says what to connect."""
    with pytest.raises(LTX25Error, match="Load Text Encoder"):
        LTX25EncodePrompt().encode(None, "a fox")
