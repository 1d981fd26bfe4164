"""Patchable model handles (nodes/comfy/handles.py, standalone patcher in nodes/comfy/bridge/standalone.py): clones
share one module and carry their own weight patches, applied in place when a clone is made ready; a handle loaded
under a small VRAM budget streams its blocks and gives the same output."""
from __future__ import annotations

import copy

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx import streaming
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from nodes.tools.tiny.common import TINY_DIMS

KEY = "dit.transformer_blocks.1.attn1.to_q.weight"


def _inputs():
    g = torch.Generator().manual_seed(5)
    return (torch.randn(1, 128, 2, 2, 2, generator=g), torch.randn(1, 8, 9, 16, generator=g),
            Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                         torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g)))


@pytest.fixture
def handle(transformer_path):
    model = T.load_transformer(transformer_path, torch.float32)
    return Loaded.register(model, inspect_asset(transformer_path))


def _x0(handle: Loaded) -> torch.Tensor:
    video, audio, cond = _inputs()
    return T.denoise(handle.ready(), video, audio, 0.5, cond, 24.0)[0]


def test_two_branches_hold_differently_patched_views_of_one_model(handle):
    """A clone with a delta on one weight and the unpatched handle, used alternately as two graph branches would:
    each gives its own output (the patched one equals a hand-patched copy), they share one module, and no weight
    is held twice (the shared module's tensors keep their storage; only the patched tensor's original is backed
    up)."""
    delta = torch.randn(handle.module.state_dict()[KEY].shape, generator=torch.Generator().manual_seed(1)) * 0.5
    patched = handle.with_weight_deltas({KEY: delta}, strength=0.8)
    assert patched.module is handle.module and patched.patcher is not handle.patcher
    reference = copy.deepcopy(handle.module)
    with torch.no_grad():
        reference.state_dict(keep_vars=True)[KEY].add_(0.8 * delta)
    video, audio, cond = _inputs()
    want_patched = T.denoise(reference, video, audio, 0.5, cond, 24.0)[0]
    want_base = _x0(handle)
    storages = {k: t.data_ptr() for k, t in handle.module.state_dict().items()}
    for _ in range(2):
        assert torch.allclose(_x0(patched), want_patched, rtol=1e-5, atol=1e-6 * float(want_patched.abs().max()))
        assert torch.equal(_x0(handle), want_base)
    assert {k: t.data_ptr() for k, t in handle.module.state_dict().items()} == storages
    backup = vars(handle.module)["_ltx25_patch_state"]["backup"]
    assert set(backup) <= {KEY}


def test_a_merged_patch_keeps_the_captured_graphs_which_then_compute_the_patched_weights(transformer_path,
                                                                                        monkeypatch):
    """A merged patch is written into the weights in place: switching to the patched clone keeps the weights'
    addresses, so the graph captured on the base view is replayed (the capture stood in for by a plain call; no
    second capture) and gives the patched model's x0, and no release hook runs; going back replays it again."""
    from nodes.ltx.dit import accelerated_denoise as A
    captures, released = [], []
    monkeypatch.setattr(A, "_record", lambda forward, cache, device: captures.append(cache.signature) or forward)
    model = T.load_transformer(transformer_path, torch.float32)
    base = Loaded.register(model, inspect_asset(transformer_path), on_unload=released.append)
    patched = base.with_weight_deltas({KEY: torch.ones_like(model.state_dict()[KEY])}, 0.1)
    video, audio, cond = _inputs()
    x0 = {}
    for view in (base, patched, base):
        module = view.ready()
        got = A._graph_denoiser(module, cond, 24.0, A.MODES["cuda_graph"])(video, audio, 0.5)
        want = T.denoise(module, video, audio, 0.5, cond, 24.0)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        x0.setdefault(id(view), got[0])
    assert len(captures) == 1 and captures[0] == A._weights_signature(model) and released == []
    assert not torch.equal(x0[id(base)], x0[id(patched)])


def test_bad_weight_patches_are_refused_by_name(handle):
    with pytest.raises(LTX25Error, match="dit.nope"):
        handle.with_weight_deltas({"dit.nope": torch.zeros(1)})
    with pytest.raises(LTX25Error, match=KEY):
        handle.with_weight_deltas({KEY: torch.zeros(3)})


def test_a_small_vram_budget_streams_the_blocks_with_the_same_output(deep_transformer):
    """Headless, a budget below the model's size (LTX25_VRAM_BUDGET_GB / set_vram_budget_gb) makes `ready` place
    the model with its blocks streamed; the output equals the resident one bit for bit."""
    model = copy.deepcopy(deep_transformer)
    handle = Loaded(model, bridge.make_patcher(model), None)
    want = _x0(handle)
    largest = max(bridge.module_bytes(b) for b in streaming.blocks_of(model))
    bridge.unload_model(handle.patcher)
    bridge.set_vram_budget_gb((bridge.module_bytes(model) - 1) / 2**30)
    try:
        got = _x0(handle)
        plan_streams = streaming.is_streaming(model)
        streamed = streaming.streamer_of(model).streamed_count
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(handle.patcher)
    assert plan_streams and streamed == 3 and largest > 0  # 5 blocks: two slots + two resident fit under the size
    assert torch.equal(got, want)


@pytest.mark.parametrize("variant", ["fp8", "int8-convrot"])
def test_dense_patches_on_a_quantized_weight_are_refused(transformer_path, tmp_path, variant):
    """A model loaded 'as stored' keeps packed weights: a dense delta added to one and cast back to its storage
    would be silently wrong, so the handle refuses it and says to load a float model (LoRA factors go on the fly:
    tests/test_lora_on_the_fly.py)."""
    from nodes.tools.tiny.quantized import write_tiny_transformer
    path = write_tiny_transformer(transformer_path, str(tmp_path / f"{variant}.safetensors"), variant)
    handle = Loaded.register(T.load_transformer(path, None), inspect_asset(path))
    key = next(k for k, t in handle.module.state_dict().items()
               if k.startswith("dit.transformer_blocks.1.attn1") and t.dtype not in (torch.bfloat16, torch.float32))
    with pytest.raises(LTX25Error, match="stored quantized"):
        handle.with_weight_deltas({key: torch.zeros(handle.module.state_dict()[key].shape)})


def test_a_heavier_phase_replans_the_placement(deep_transformer):
    """Placed first for a light phase (the connectors' small working memory), the model is placed again when a
    phase asks for more working memory (sampling): fewer blocks stay resident, so the slots and activations fit the
    budget (on the H200 the old placement ran out of memory allocating the slots)."""
    model = copy.deepcopy(deep_transformer)
    handle = Loaded(model, bridge.make_patcher(model), None)
    largest = max(bridge.module_bytes(b) for b in streaming.blocks_of(model))
    bridge.set_vram_budget_gb((bridge.module_bytes(model) - 1) / 2**30)
    try:
        handle.ready(0)
        light = streaming.streamer_of(model).streamed_count
        handle.ready(largest)
        heavy = streaming.streamer_of(model).streamed_count
        handle.ready(0)  # a light phase again keeps the heavier plan
        again = streaming.streamer_of(model).streamed_count
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(handle.patcher)
    assert (light, heavy, again) == (3, 4, 4)


def test_a_decoder_is_placed_even_when_its_untiled_working_memory_exceeds_the_budget(deep_transformer):
    """A model without blocks (a decoder) asks for its untiled working memory so that much is freed where possible;
    if less is available it is still placed and its auto tiling plans within what is free (on a 16 GiB card the
    diffusion decoder was refused for its 18 GiB untiled estimate). A model with blocks cannot tile its working
    memory away: the same shortfall is an error naming it."""
    decoder = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    handle = Loaded(decoder, bridge.make_patcher(decoder), None)
    transformer = copy.deepcopy(deep_transformer)
    dit = Loaded(transformer, bridge.make_patcher(transformer), None)
    bridge.set_vram_budget_gb(2 * bridge.module_bytes(transformer) / 2**30)
    try:
        assert handle.ready(1 << 40) is decoder and handle.patcher.is_loaded()
        with pytest.raises(LTX25Error, match="LTX25Transformer"):
            dit.ready(1 << 40)
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(handle.patcher)
        bridge.unload_model(dit.patcher)
