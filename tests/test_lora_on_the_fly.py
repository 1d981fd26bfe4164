"""LoRAs applied on the fly (nodes/ltx/kernels/lora_linear.py through the handles and the standalone patcher): on
every quantized format they equal the dequantized weights with the LoRA merged by hand, several at once at their own
strengths; strength 0 and undoing are exact; two branches share one copy of the weights; streamed blocks carry their
factors through the slots and give the resident output bit for bit; the graph signature sees each factor's extent;
merged patching backs up each merged weight once. Switching views (graphs, parked factors): tests/test_lora_views.py."""
from __future__ import annotations

import copy

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx import streaming
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import accelerated_denoise
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.files.lora import LoraFactors, LoraTargets, read_lora
from nodes.ltx.kernels import lora_linear
from nodes.ltx.kernels import quantized_linear as QL
from nodes.tools.tiny import lora as tiny_lora
from nodes.tools.tiny import quantized as tiny_quantized
from nodes.tools.tiny.common import TINY_DIMS

KINDS = ("nvfp4", "fp8", "int8", "int8-convrot")
U_BF16 = 2.0**-8
RANK, ALPHA = 4, 2.0
LORAS = (("peft", 1, 0.7, None), ("kohya", 2, -0.4, ALPHA))  # style, seed, strength, alpha


def _relative(got, want) -> float:
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, want))


def _inputs():
    """Small latents and a 16-token prompt: the tests compare x0s, which need no realistic context length."""
    g = torch.Generator().manual_seed(21)
    return (torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g),
            Conditioning(torch.randn(1, 16, TINY_DIMS["video_inner"], generator=g),
                         torch.randn(1, 16, TINY_DIMS["audio_inner"], generator=g)))


def _x0(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    video, audio, cond = _inputs()
    return T.denoise(module, video, audio, 0.6, cond, 24.0)


def _factors(seed: int, out_features: int, in_features: int, rank: int = RANK, alpha=None) -> LoraFactors:
    g = torch.Generator().manual_seed(seed)
    return LoraFactors(torch.randn(out_features, rank, generator=g) * 0.1, torch.randn(rank, in_features, generator=g)
                       * 0.1, alpha)


def _hand_merged(module: torch.nn.Module, loras) -> torch.nn.Module:
    """A copy whose weights are W + Σ strength·scale·up@down, added by hand from the tiny writer's factors."""
    merged = copy.deepcopy(module)
    state = merged.state_dict(keep_vars=True)
    with torch.no_grad():
        for _style, seed, strength, alpha in loras:
            scale = 1.0 if alpha is None else alpha / RANK
            for key, (up, down) in tiny_lora.tiny_lora_factors(seed, RANK).items():
                state[key].add_(strength * scale * (up @ down))
    return merged


def _with_loras(handle: Loaded, tmp_path, loras=LORAS, apply: str = "auto") -> Loaded:
    targets = LoraTargets.of(handle.module, T.KEY_MAP)
    for style, seed, strength, alpha in loras:
        path = tiny_lora.write_tiny_lora(str(tmp_path / f"{style}{seed}.safetensors"), style, seed, RANK, alpha)
        handle = handle.with_weight_deltas(read_lora(path, targets), strength, apply)
    return handle


# ---------------------------------------------------------------------------------------------------- one layer
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_quantized_layer_with_two_loras_equals_dequantize_then_merge(kind, dtype):
    """Two LoRAs (strengths 0.8 and −1.3, one with alpha) on a layer kept quantized: its output equals
    `F.linear(x, dequantized W + Σ s·alpha/rank·up@down)` — float32 rounding in float32, a few bf16 roundings of
    the output's scale in bf16. Fails if a factor is transposed, a strength or alpha is dropped, or the update is
    added to the rotated activations of int8-convrot."""
    layer = QL.random_quantized_linear(kind, 512, 96, bias=True, convrot_groupsize=256, seed=3).to(dtype)
    loras = [(0.8, _factors(1, 96, 512)), (-1.3, _factors(2, 96, 512, rank=8, alpha=4.0))]
    model = torch.nn.Module()
    model.layer = layer
    assert lora_linear.install(model, {"layer.weight": loras}, "two")
    x = torch.randn(3, 7, 512, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = layer(x)
    weight = layer.dequantized_weight(torch.float32) + sum(s * f.delta(torch.device("cpu")) for s, f in loras)
    want = torch.nn.functional.linear(x.float(), weight, layer.bias.float())
    base = torch.nn.functional.linear(x.float(), layer.dequantized_weight(torch.float32), layer.bias.float())
    bound = 1e-5 if dtype == torch.float32 else 6 * U_BF16
    assert got.dtype == dtype and _relative([got], [want]) < bound, f"{kind} {dtype}: {_relative([got], [want]):.2e}"
    assert _relative([base], [want]) > 0.05, "the LoRAs changed nothing"


def test_strength_zero_and_removal_leave_a_quantized_layer_bit_for_bit():
    """A LoRA at strength 0 installs nothing, and removing the LoRAs leaves no buffer: the layer's output is the
    bare layer's exactly (no `+ 0·delta` rounding, no -0.0)."""
    layer = QL.random_quantized_linear("nvfp4", 64, 32, bias=True, seed=5)
    model = torch.nn.Module()
    model.layer = layer
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    bare = layer(x)
    assert not lora_linear.install(model, {"layer.weight": [(0.0, _factors(1, 32, 64))]}, "zero")
    assert torch.equal(layer(x), bare) and not lora_linear.patched_layers(model)
    assert lora_linear.install(model, {"layer.weight": [(1.0, _factors(1, 32, 64))]}, "one")
    assert not torch.equal(layer(x), bare)
    assert lora_linear.install(model, {}, "none")
    assert torch.equal(layer(x), bare) and not lora_linear.patched_layers(model)


def test_low_rank_targets_other_than_linear_weights_are_refused():
    model = torch.nn.Module()
    model.norm = torch.nn.LayerNorm(8)
    with pytest.raises(LTX25Error, match="norm.weight"):
        lora_linear.install(model, {"norm.weight": [(1.0, _factors(1, 8, 8))]}, "bad")


# ---------------------------------------------------------------------------------------------------- the tiny model
@pytest.fixture(scope="module")
def quantized_path(transformer_path, tmp_path_factory):
    folder, paths = tmp_path_factory.mktemp("lora_quantized"), {}

    def get(variant: str) -> str:
        if variant not in paths:
            paths[variant] = tiny_quantized.write_tiny_transformer(transformer_path, str(folder / f"{variant}.sft"),
                                                                   variant)
        return paths[variant]
    return get


@pytest.mark.parametrize("variant", list(tiny_quantized.VARIANTS))
def test_loras_on_a_transformer_kept_quantized_equal_the_dequantized_model_merged_by_hand(quantized_path, tmp_path,
                                                                                          variant):
    """The tiny NVFP4 / FP8 / int8-convrot transformer loaded as stored, two LoRA files stacked (PEFT at 0.7,
    kohya with alpha at −0.4) through the handle: its x0 equals the same file loaded dequantized with the LoRAs
    merged into its weights by hand (both run in float32 here, so only float32 rounding separates them). The
    quantized weights are never touched: same storage, same bytes, no backup."""
    path = quantized_path(variant)
    module = T.load_transformer(path, None).float()  # float32 activations; the stored formats stay as they are
    handle = Loaded.register(module, inspect_asset(path))
    stored = {k: (t.data_ptr(), t.clone()) for k, t in module.state_dict().items() if t.dtype not in
              (torch.float32, torch.bfloat16)}
    got = _x0(_with_loras(handle, tmp_path).ready())
    want = _x0(_hand_merged(T.load_transformer(path, torch.float32), LORAS))
    assert _relative(got, want) < 1e-5, f"{variant}: {_relative(got, want):.2e}"
    layers = [module.get_submodule(name) for name in lora_linear.patched_layers(module)]
    assert len(layers) == len(tiny_lora.tiny_lora_factors(1, RANK))
    # in the activations' dtype, also for the quantized FF Linears that have no bias to tell it
    assert {m.lora_up.dtype for m in layers} == {torch.float32} and any(m.bias is None for m in layers)
    state = module.state_dict()
    assert all(state[k].data_ptr() == ptr and torch.equal(state[k], t) for k, (ptr, t) in stored.items())
    assert not vars(module)["_ltx25_patch_state"]["backup"]


def test_dense_deltas_and_merges_on_quantized_weights_are_refused(quantized_path):
    """A dense delta cannot be added to a packed weight, and 'merged' would round the sum back into the format:
    both are refused naming the weight and the way out; LoRA factors on the fly are accepted."""
    path = quantized_path("fp8")
    handle = Loaded.register(T.load_transformer(path, None), inspect_asset(path))
    key = "dit.transformer_blocks.0.attn1.to_q.weight"
    layer = handle.module.get_submodule(key[: -len(".weight")])
    factors = _factors(1, layer.out_features, layer.in_features)
    with pytest.raises(LTX25Error, match="stored quantized"):
        handle.with_weight_deltas({key: torch.zeros(layer.weight.shape)})
    with pytest.raises(LTX25Error, match="merged"):
        handle.with_weight_deltas({key: factors}, apply="merged")
    with pytest.raises(LTX25Error, match=r"\(out, in\)"):
        handle.with_weight_deltas({key: _factors(1, layer.out_features, 3)})
    assert set(bridge.low_rank_of(handle.with_weight_deltas({key: factors}).patcher).updates) == {key}


@pytest.fixture
def handle(transformer_path):
    return Loaded.register(T.load_transformer(transformer_path, torch.float32), inspect_asset(transformer_path))


def test_two_branches_with_different_loras_share_one_copy_of_the_weights(handle, tmp_path):
    """Two views of one model with different LoRAs on the fly, made ready alternately as two graph branches would
    be: each gives its hand-merged model's x0 every time (bit-identical from round to round), no weight tensor is
    copied or moved (same storage, nothing backed up), and the only extra bytes are the current view's factors."""
    first = _with_loras(handle, tmp_path, LORAS[:1])
    second = _with_loras(handle, tmp_path, LORAS[1:])
    want = {id(first): _x0(_hand_merged(handle.module, LORAS[:1])),
            id(second): _x0(_hand_merged(handle.module, LORAS[1:]))}
    base_bytes = bridge.module_bytes(handle.module)
    storages = {k: t.data_ptr() for k, t in handle.module.state_dict().items()}
    seen = {}
    for _ in range(2):
        for view in (first, second):
            got = _x0(view.ready())
            assert _relative(got, want[id(view)]) < 1e-5, f"{_relative(got, want[id(view)]):.2e}"
            assert all(torch.equal(a, b) for a, b in zip(got, seen.setdefault(id(view), got)))
            factors = bridge.low_rank_of(view.patcher).nbytes() * 2  # fp32 buffers from a bf16 file
            assert bridge.module_bytes(handle.module) == base_bytes + factors
    assert {k: t.data_ptr() for k, t in handle.module.state_dict().items()} == storages
    assert not vars(handle.module)["_ltx25_patch_state"]["backup"]


@pytest.mark.parametrize("apply", ["on_the_fly", "merged"])
def test_patch_and_unpatch_round_trip_exactly(handle, tmp_path, apply):
    """base → two LoRAs → base: every weight and the x0 are the base's bit for bit again, and no LoRA buffer is
    left on a layer (merged: the originals come back from the host backup, which is then dropped)."""
    base = _x0(handle.ready())
    weights = {k: v.clone() for k, v in handle.module.state_dict().items()}
    assert _relative(_x0(_with_loras(handle, tmp_path, apply=apply).ready()), base) > 1e-3
    again = _x0(handle.ready())
    assert all(torch.equal(a, b) for a, b in zip(again, base))
    assert all(torch.equal(t, weights[k]) for k, t in handle.module.state_dict().items())
    assert not lora_linear.patched_layers(handle.module) and not vars(handle.module)["_ltx25_patch_state"]["backup"]


def test_merged_views_back_up_each_weight_once_and_only_while_merged(handle, tmp_path):
    """Switching between two merged views of the same weights reuses the host backup (each original is copied
    once, not again on every switch) and holds only the merged weights; the unmerged view drops it."""
    first = _with_loras(handle, tmp_path, LORAS[:1], apply="merged")
    second = _with_loras(handle, tmp_path, LORAS[1:], apply="merged")
    first.ready()
    backup = vars(handle.module)["_ltx25_patch_state"]["backup"]
    copies = {k: id(t) for k, t in backup.items()}
    assert set(copies) == set(tiny_lora.tiny_lora_factors(1, RANK))
    second.ready()
    assert {k: id(t) for k, t in backup.items()} == copies
    handle.ready()
    assert not backup


def test_pinned_host_copies_serve_as_merge_backups_and_leave_with_removed_factors(handle, tmp_path):
    """With pinned host copies of the placed tensors (streaming.place keep_host; recorded by hand here, the CPU has
    no pinned memory): a weight merged for the first time takes its host copy as the backup instead of a new host
    copy, and factors a view change removes lose theirs, which would otherwise keep them (and their device memory)
    alive."""
    merged = _with_loras(handle, tmp_path, LORAS[:1], apply="merged")
    on_the_fly = _with_loras(handle, tmp_path, LORAS[1:])
    module = handle.ready()
    copies = vars(module).setdefault("_ltx25_host_copies", {})
    state = module.state_dict(keep_vars=True)
    key = next(iter(tiny_lora.tiny_lora_factors(1, RANK)))
    host = state[key].detach().clone()
    copies[id(state[key])] = (state[key], host)
    merged.ready()
    assert vars(module)["_ltx25_patch_state"]["backup"][key] is host and id(state[key]) not in copies
    on_the_fly.ready()
    layer = module.get_submodule(lora_linear.patched_layers(module)[0])
    factors = [layer.lora_down, layer.lora_up]
    copies.update({id(t): (t, t.clone()) for t in factors})
    handle.ready()
    assert not any(id(t) in copies for t in factors) and not lora_linear.patched_layers(module)


def test_the_graph_signature_sees_other_ranks_at_the_same_addresses(handle, tmp_path):
    """A caching allocator may put a new view's factors exactly where the last view's were: with other ranks a
    replay would read the wrong extents. The signature holds each tensor's shape beside its address (a narrower
    view of the same memory changes it) and the installed set's token (a new set with every buffer in place
    changes it)."""
    module = _with_loras(handle, tmp_path, LORAS[:1]).ready()
    layer = module.get_submodule(lora_linear.patched_layers(module)[0])
    before = accelerated_denoise._weights_signature(module)
    down, up = layer.lora_down, layer.lora_up
    layer.lora_down, layer.lora_up = down[:2], up[:, :2]  # the same first addresses, rank 2
    assert layer.lora_down.data_ptr() == down.data_ptr()
    assert accelerated_denoise._weights_signature(module) != before
    layer.lora_down, layer.lora_up = down, up
    assert accelerated_denoise._weights_signature(module) == before
    vars(module)["_ltx25_low_rank"] = object()
    assert accelerated_denoise._weights_signature(module) != before


def test_loras_installed_after_the_blocks_were_compiled_reach_the_compiled_code(handle, tmp_path, monkeypatch):
    """torch.compile does not guard on hooks: a LoRA hook added to a layer after its block was compiled would never
    run. Compiling hooks every Linear first, so a view with LoRAs installed later, then the base view again, give
    eager's x0 through the compiled blocks (dynamo's `eager` backend stands in for inductor, as in
    test_accelerated_denoise)."""
    from nodes.ltx import compile_cache
    monkeypatch.setattr(compile_cache, "_applied", None)
    monkeypatch.setenv(compile_cache.ENV, compile_cache.OFF)  # nothing is written: the eager backend compiles nothing
    module = handle.module
    original = module.dit.compile_repeated_blocks
    monkeypatch.setattr(module.dit, "compile_repeated_blocks", lambda **kw: original(**kw, backend="eager"))
    view = _with_loras(handle, tmp_path, LORAS[:1])
    video, audio, cond = _inputs()
    try:
        for current in (handle, view, handle):
            got = accelerated_denoise.make_denoiser(current.ready(), cond, 24.0, "compile")(video, audio, 0.6)
            want = accelerated_denoise.make_denoiser(current.ready(), cond, 24.0, "eager")(video, audio, 0.6)
            assert _relative(got, want) < 1e-5, f"compiled vs eager: {_relative(got, want):.2e}"
        assert _relative(_x0(view.ready()), _x0(handle.ready())) > 1e-3
    finally:
        torch._dynamo.reset()
        accelerated_denoise._set_compiled(module, False)


# ---------------------------------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("apply", ["on_the_fly", "merged"])
def test_streamed_blocks_with_loras_equal_the_resident_model_exactly(deep_transformer, apply):
    """Under a VRAM budget below the model's size the standalone placement streams blocks: with LoRAs on the fly
    the streamed blocks' factors pass through the slots with their weights (they are among the streamer's entries),
    merged ones were written into the host weights first; either way x0 equals the resident LoRA'd model's bit for
    bit."""
    model = copy.deepcopy(deep_transformer)
    base = Loaded(model, bridge.make_patcher(model), None)
    layers = [(name, m) for name, m in model.named_modules() if name.startswith("dit.transformer_blocks.") and
              name.endswith(tuple(leaf[: -len(".weight")] for leaf in tiny_lora.TARGET_LEAVES))]
    factors = {f"{name}.weight": _factors(i, m.out_features, m.in_features) for i, (name, m) in enumerate(layers)}
    assert {name.split(".")[2] for name, _ in layers} == {"0", "1", "2", "3", "4"}  # every block, streamed ones too
    patched = base.with_weight_deltas(factors, 0.9, apply)
    want = _x0(patched.ready())
    bridge.unload_model(patched.patcher)
    bridge.set_vram_budget_gb((bridge.module_bytes(model) - 1) / 2**30)
    try:
        got = _x0(patched.ready())
        streamer = streaming.streamer_of(model)
        names = {name for s in streamer.streamed.values() for _table, name, _host, _ in s.entries}
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(patched.patcher)
    assert streamer.streamed_count > 0 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert ({"lora_down", "lora_up"} <= names) == (apply == "on_the_fly")


def test_a_quantized_transformer_with_loras_streams_with_the_resident_output(quantized_path, tmp_path):
    """Every block of the tiny int8-convrot transformer streamed (forced) while a LoRA applies on the fly: the
    packed weights, scales and LoRA factors all pass through the slots, and x0 equals the resident run's exactly."""
    path = quantized_path("int8-convrot")
    handle = Loaded.register(T.load_transformer(path, None), inspect_asset(path))
    module = _with_loras(handle, tmp_path, LORAS[:1]).ready()
    want = _x0(module)
    blocks = streaming.blocks_of(module)
    streamer = streaming.BlockStreamer(blocks, torch.device("cpu"), force_stream=blocks).install(module)
    try:
        got = _x0(module)
    finally:
        streaming.remove_streamer(module)
    names = {name for s in streamer.streamed.values() for _table, name, _host, _ in s.entries}
    assert streamer.streamed_count == len(blocks) and {"lora_down", "lora_up", "weight_scale"} <= names
    assert all(torch.equal(a, b) for a, b in zip(got, want))
