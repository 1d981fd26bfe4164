"""Switching between views of one model with LoRAs on the fly (nodes/ltx/kernels/lora_linear.py parking, the CUDA
graph cache of nodes/ltx/dit/accelerated_denoise.py, the standalone patcher): the set a switch removes is parked and
comes back as the same tensors; each view's graphs are kept and replayed, never over other tensors than they were
captured with (a stand-in capture checks every replay); a new set, a set whose factors are gone or moved weights
capture again; MAX_GRAPHS bounds all views; unloading or a short placement drops the parked set."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx import streaming
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import accelerated_denoise
from nodes.ltx.dit import transformer as T
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.files.lora import LoraTargets, read_lora
from nodes.ltx.kernels import lora_linear
from nodes.tools.tiny import lora as tiny_lora
from test_lora_on_the_fly import LORAS, RANK, _factors, _inputs, _relative, _with_loras


def test_a_parked_set_serves_again_only_beside_its_weights_in_their_dtype():
    """With `keep`, the set a switch removes is parked and installing its token again puts the same tensors back;
    after the model was cast (or moved) they no longer sit beside the weights in their dtype and are made again;
    without `keep` nothing is parked."""
    model = torch.nn.Module()
    model.layer = torch.nn.Linear(64, 32)
    a, b = {"layer.weight": [(1.0, _factors(1, 32, 64))]}, {"layer.weight": [(0.5, _factors(2, 32, 64))]}
    lora_linear.install(model, a, "a", keep=True)
    down = model.layer.lora_down
    lora_linear.install(model, b, "b", keep=True)
    assert lora_linear.live_tokens(model) == ("b", "a") and lora_linear.parked_bytes(model) > 0
    lora_linear.install(model, a, "a", keep=True)
    assert model.layer.lora_down is down and lora_linear.live_tokens(model) == ("a", "b")
    model.bfloat16()
    lora_linear.install(model, b, "b", keep=True)
    assert model.layer.lora_down.dtype == torch.bfloat16, "fp32 factors parked before the cast came back"
    lora_linear.install(model, a, "a")
    assert lora_linear.parked_bytes(model) == 0 and lora_linear.live_tokens(model) == ("a", None)


class _Reads(TorchDispatchMode):
    """Records the tensors a forward reads that it did not make itself (weights, buffers, LoRA factors, caches on
    the model, static inputs): (address, shape, stride, dtype) of every such operand of every op. What an op
    returns is made by the forward, and so is anything read through it (a weight's transpose)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: set[tuple] = set()
        self._made: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = [*args, *(kwargs or {}).values()]
        for t in (t for arg in operands for t in (arg if isinstance(arg, (list, tuple)) else (arg,))):
            if isinstance(t, torch.Tensor) and t.data_ptr() not in self._made:
                self.reads.add((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype))
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel():
                self._made.add(t.data_ptr())
        return out


def _reads_of(forward) -> tuple[set, object]:
    with _Reads() as mode:
        out = forward()
    return mode.reads, out


def _address_checked_capture(monkeypatch, module: torch.nn.Module) -> list:
    """The CUDA capture replaced by a stand-in that, like a real graph, is only valid over the tensors it was
    captured with: after a warm-up forward the 'capture' records every tensor the forward reads from outside itself
    (by address, shape, stride and dtype, whatever the cache's signature holds), and each 'replay' fails unless
    the forward reads exactly those again. Returns the cache signatures captured, in order."""
    captured = []

    def record(forward, cache, device):
        captured.append(cache.signature)
        forward()  # the warm-up a real capture runs first: caches the forward fills are in place
        reads, _ = _reads_of(forward)
        assert any(address == t.data_ptr() for address, *_ in reads for t in module.parameters())

        def replay():
            now, out = _reads_of(forward)
            assert now == reads, (f"a graph replayed over other tensors than it was captured with: "
                                  f"{len(reads - now)} read at capture, {len(now - reads)} new")
            return out
        return replay
    monkeypatch.setattr(accelerated_denoise, "_record", record)
    return captured


def _graph_x0(view: Loaded, shape=(1, 128, 2, 2, 2)) -> tuple[torch.Tensor, torch.Tensor]:
    """`view` made ready, then one step of the graph denoiser (the stand-in capture) against the eager x0."""
    module = view.ready()
    _video, audio, cond = _inputs()
    video = torch.randn(shape, generator=torch.Generator().manual_seed(22))
    got = accelerated_denoise._graph_denoiser(module, cond, 24.0, accelerated_denoise.MODES["cuda_graph"])(
        video, audio, 0.6)
    want = T.denoise(module, video, audio, 0.6, cond, 24.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), f"graph vs eager: {_relative(got, want):.2e}"
    return got


@pytest.fixture
def graphed(transformer_path, monkeypatch):
    """A float32 tiny transformer registered as the loader registers it (release on unload), with the capture
    stand-in: (base handle, captured signatures)."""
    module = T.load_transformer(transformer_path, torch.float32)
    base = Loaded.register(module, inspect_asset(transformer_path), on_unload=accelerated_denoise.release)
    return base, _address_checked_capture(monkeypatch, module)


def _counts() -> tuple[int, int, int, int]:
    return (accelerated_denoise.COUNTS.captures, accelerated_denoise.COUNTS.warmup_calls,
            lora_linear.COUNTS.built_layers, lora_linear.COUNTS.reused_layers)


def _guided_x0(view: Loaded, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`view` made ready, then one step of the dev stage 1's guided denoiser (CFG, STG at block 1, modality
    guidance: three graphs, cond and uncond sharing one) through its graph path on the CPU."""
    from nodes.ltx.dit import guidance as G
    monkeypatch.setattr(G, "_eager_forward", G._graph_forward)
    video, audio, cond = _inputs()
    negative = Conditioning(-cond.video, -cond.audio)
    guidance = G.Guidance(cond, negative, G.ModalityGuidance(cfg=3.0, stg=1.0, stg_blocks=(1,), modality=2.0),
                          G.ModalityGuidance(cfg=7.0))
    return G.make_guided_denoiser(view.ready(), guidance, 24.0, "eager")(video, audio, 0.6)


def test_switching_between_the_plain_and_the_lora_view_replays_both_views_graphs(graphed, tmp_path, monkeypatch):
    """The dev pipeline's pattern, three runs: the plain view guided (stage 1: three graphs), then a view with a
    LoRA on the fly (stage 2: one graph), and back. Each view is captured on the first run only; later runs replay
    its graphs (the stand-in fails a replay over moved or other tensors) with the first run's x0. Switching back to
    the LoRA view puts back the very factor tensors that were parked beside the model: nothing is copied again.
    Fails if a view change drops the graphs, if the removed set is not parked or not reused, or if the two views
    share a graph."""
    base, captured = graphed
    lora = _with_loras(base, tmp_path, LORAS[:1])
    layers = len(tiny_lora.tiny_lora_factors(1, RANK))
    start = _counts()
    x0 = [(_guided_x0(base, monkeypatch), _graph_x0(lora)) for _ in range(3)]
    module = base.module
    assert len(captured) == 4 and len(set(captured[:3])) == 1 and captured[3].token != captured[0].token
    assert not captured[0].factors and captured[3].factors
    captures, warmups, built, reused = (b - a for a, b in zip(start, _counts()))
    assert (captures, warmups) == (4, 4 * accelerated_denoise.WARMUP_CALLS)
    assert (built, reused) == (layers, 2 * layers), f"factors built {built}, reused {reused} of {layers} layers"
    assert all(torch.equal(a, b) for run in x0[1:] for got, want in zip(run, x0[0]) for a, b in zip(got, want))
    lora.ready()
    kept = [(m.lora_down, m.lora_up) for m in map(module.get_submodule, lora_linear.patched_layers(module))]
    base.ready()
    assert lora_linear.parked_bytes(module) == sum(t.nbytes for pair in kept for t in pair)
    lora.ready()
    again = [(m.lora_down, m.lora_up) for m in map(module.get_submodule, lora_linear.patched_layers(module))]
    assert all(a is b for pair, other in zip(kept, again) for a, b in zip(pair, other))
    assert _relative(_graph_x0(lora), _graph_x0(base)) > 1e-3, "the LoRA view computes the plain model"


def test_without_parking_the_plain_views_graphs_still_outlive_a_lora_view(graphed, tmp_path, monkeypatch):
    """Where nothing is parked (ComfyUI's model management, which would not see the parked memory), a LoRA view's
    factors are copied again at each switch and its graph is captured again; the plain view's graphs read only the
    weights and are replayed whichever LoRA view ran in between. Fails if graphs without factors are dropped with
    the set they were filed under."""
    from nodes.comfy.bridge import standalone
    monkeypatch.setattr(standalone, "install_low_rank", lambda model, updates, token, keep=False:
                        lora_linear.install(model, updates, token))
    base, captured = graphed
    lora = _with_loras(base, tmp_path, LORAS[:1])
    for view in (base, lora, base, lora):
        _graph_x0(view)
    assert [s.token for s in captured] == [bridge.low_rank_of(v.patcher).token for v in (base, lora, lora)]


def test_a_new_strength_a_third_view_or_a_moved_weight_capture_again(graphed, tmp_path):
    """Graphs are only found under the exact set and addresses: the LoRA at another strength (a new set) is
    captured anew while the earlier sets still replay; a switch that leaves a set neither installed nor parked
    drops its graphs (its factors are gone, so they could never replay) and it is captured again on its next use;
    a moved weight drops every view's graphs."""
    base, captured = graphed
    strong = _with_loras(base, tmp_path, LORAS[:1])
    weak = base.with_weight_deltas(read_lora(str(tmp_path / "peft1.safetensors"),
                                             LoraTargets.of(base.module, T.KEY_MAP)), 0.3)
    token = {id(v): bridge.low_rank_of(v.patcher).token for v in (base, strong, weak)}
    for view in (base, strong, weak, strong, base):
        _graph_x0(view)
    assert [s.token for s in captured] == [token[id(v)] for v in (base, strong, weak)]
    store = vars(base.module)["_ltx25_graphs"]
    assert {s.token for s in store.views} == {token[id(base)], token[id(strong)]}, "weak's factors are gone"
    _graph_x0(weak)
    assert len(captured) == 4 and captured[3].token == token[id(weak)]
    weight = base.module.dit.transformer_blocks[0].ff.net[2].weight
    weight.data = weight.data.clone()
    store.pool = "the old pool"  # every view's graphs are dropped: the next capture makes a fresh pool
    _graph_x0(base)
    assert len(captured) == 5 and len(store.views) == 1 and store.pool is None


def test_the_graphs_of_all_views_stay_within_max_graphs(graphed, tmp_path, monkeypatch):
    """`MAX_GRAPHS` bounds a model's graphs over all its views (their memory pool is one): two views at two shapes
    each never hold more than the bound, and a capture beyond it starts every view over."""
    base, captured = graphed
    monkeypatch.setattr(accelerated_denoise, "MAX_GRAPHS", 3)
    lora = _with_loras(base, tmp_path, LORAS[:1])
    store = []
    for view in (base, lora):
        for shape in ((1, 128, 2, 2, 2), (1, 128, 2, 4, 2)):
            _graph_x0(view, shape)
            store = vars(base.module)["_ltx25_graphs"]
            assert sum(map(len, store.views.values())) <= 3
    assert len(captured) == 4 and sum(map(len, store.views.values())) == 1


def test_offloading_or_a_short_placement_drops_the_parked_set(graphed, tmp_path, monkeypatch):
    """Parked factors are memory beside the weights that model management does not see: the model's unload drops
    them (with the graphs), and so does a placement that would otherwise have to stream the blocks (a card stood in
    for, whose free memory the parked set takes, fitting the LoRA view, or the plain view with a working memory the
    size of the factors, but not that beside them); the next install copies the factors again."""
    from nodes.comfy.bridge import standalone
    base, _captured = graphed
    module = base.module
    lora = _with_loras(base, tmp_path, LORAS[:1])
    lora.ready()
    base.ready()
    parked = lora_linear.parked_bytes(module)
    assert parked > 0
    bridge.unload_model(base.patcher)
    assert lora_linear.parked_bytes(module) == 0 and "_ltx25_graphs" not in vars(module)
    card = bridge.module_bytes(module) + parked + parked // 2
    monkeypatch.setattr(standalone.StandalonePatcher, "_budget",
                        lambda self, device: card - lora_linear.parked_bytes(self.model))
    lora.ready()  # built again; the plain view's (empty) set parked
    built = lora_linear.COUNTS.built_layers
    base.ready(parked)
    assert lora_linear.parked_bytes(module) == 0 and not streaming.is_streaming(module)
    monkeypatch.undo()  # a card as large as the host again: the LoRA view beside the plain view's working memory
    lora.ready()
    assert lora_linear.COUNTS.built_layers > built


class _Patcher:
    """The parts of a ComfyUI ModelPatcher `_comfy_load` reads, set by the test."""


def test_comfyui_loads_ask_for_the_kept_graphs_idle_pool_and_release_graphs_of_repatched_weights(monkeypatch):
    """ComfyUI's free memory counts the idle memory of the private pools of CUDA graphs kept across loads as free:
    `_comfy_load` asks model management for it on top of the work's memory (or it evicts too little); the run's
    request remembered for a reload stays the caller's. A model whose weights carry another view's merged patches
    (ComfyUI unpatches them in this load, new tensors) has its graphs released before the load, not one whose
    weights carry this view's or none; a model that model management partly unloaded since it was settled has its
    graphs dropped, not one left in place."""
    import types
    import uuid
    from nodes.comfy.bridge import comfy_models
    gib = 2**30
    asked, released, emptied = [], [], []
    monkeypatch.setattr(comfy_models, "_mm", types.SimpleNamespace(
        load_models_gpu=lambda patchers, memory_required, force_full_load: asked.append(memory_required),
        soft_empty_cache=lambda: emptied.append(True)))
    monkeypatch.setattr(comfy_models, "graph_pool_idle_bytes", lambda device: 3 * gib if device.type == "cuda" else 0)
    monkeypatch.setattr(comfy_models, "_settle", lambda p: None)
    monkeypatch.setattr(comfy_models, "_in_use", ([], 0))
    monkeypatch.setattr(comfy_models, "_install_low_rank_comfy", lambda p: None)
    module = torch.nn.Linear(4, 4)
    vars(module)["_ltx25_release"] = released.append
    mine = uuid.uuid4()
    patcher = _Patcher()
    patcher.model, patcher.load_device, patcher.patches_uuid = module, torch.device("cuda", 0), mine
    patcher.low_rank = lora_linear.NO_LOW_RANK
    for weights_patched_by in (None, mine):
        module.current_weight_patches_uuid = weights_patched_by
        comfy_models._comfy_load([patcher], 5 * gib)
    assert asked == [8 * gib, 8 * gib] and comfy_models._in_use[1] == 5 * gib and not released
    module.current_weight_patches_uuid = uuid.uuid4()
    comfy_models._comfy_load([patcher], 5 * gib)
    assert released == [module] and emptied
    # Settled, then another model's load partially unloads it: its graphs read addresses the weights have left.
    module.current_weight_patches_uuid, module.model_loaded_weight_memory, emptied[:] = mine, 6 * gib, []
    vars(module)["_ltx25_settled"] = (comfy_models._placement_token(patcher), None)
    vars(module)["_ltx25_graphs"] = object()
    comfy_models._comfy_load([patcher], 5 * gib)
    assert "_ltx25_graphs" in vars(module) and not emptied, "graphs of weights left in place must be kept"
    module.model_loaded_weight_memory = 4 * gib
    comfy_models._comfy_load([patcher], 5 * gib)
    assert "_ltx25_graphs" not in vars(module) and emptied and released == [module], "graphs of moved weights kept"


def test_a_load_needing_room_drops_what_live_models_keep_before_unloading_them(monkeypatch):
    """Standalone: a decoder needing room that the transformer's graphs and parked LoRA set take gets it from
    them; the transformer stays on the device (an unload would cost a full reload on the next run). Only when that
    is not enough is the transformer unloaded."""
    from test_bridge import FakePatcher
    gib = 2**30
    transformer, decoder = FakePatcher(8 * gib), FakePatcher(4 * gib)
    kept = {"bytes": 0}
    transformer.on_unload = lambda model: kept.update(bytes=0)
    capacity = 16 * gib
    live = bridge.standalone._standalone_live
    monkeypatch.setattr(bridge.standalone, "free_device_memory",
                        lambda device=None: capacity - kept["bytes"] - sum(p.size for p in live() if p.on_device))
    bridge.load_models([transformer])
    kept["bytes"] = 3 * gib  # graphs and a parked set: 5 GiB free, 4 + 1 of work + the headroom does not fit
    bridge.load_models([decoder], memory_required=gib)
    assert decoder.on_device and transformer.on_device and kept["bytes"] == 0
    bridge.unload_model(decoder)
    capacity = 12 * gib
    bridge.load_models([decoder], memory_required=gib)
    assert decoder.on_device and not transformer.on_device, "nothing else frees the room: the transformer goes"
    bridge.unload_model(decoder)


def test_an_offloaded_model_parks_nothing(graphed, tmp_path):
    """A view switch while the model is off its device (unloaded) parks nothing: factors left on the host could
    never serve again beside the placed weights."""
    base, _captured = graphed
    lora = _with_loras(base, tmp_path, LORAS[:1])
    lora.ready()
    bridge.unload_model(lora.patcher)
    base.ready()
    assert lora_linear.parked_bytes(base.module) == 0 and lora_linear.live_tokens(base.module)[1] is None
    lora.ready()
    base.ready()
    assert lora_linear.parked_bytes(base.module) > 0, "a placed model parks the set a switch removes"


def test_a_store_without_graphs_forgets_its_pool():
    """When every graph is dropped (the bound reached, or every view pruned) the pool handle goes too, so the next
    capture starts a fresh pool instead of growing the old one."""
    store = accelerated_denoise._GraphStore()
    cache = accelerated_denoise._GraphCache(None, store.views.setdefault("view", {}), store)
    store.pool = "pool"
    cache.graphs.update({i: object() for i in range(accelerated_denoise.MAX_GRAPHS - 1)})
    cache.make_room()
    assert store.pool == "pool"
    cache.graphs["last"] = object()
    cache.make_room()
    assert store.pool is None and not cache.graphs
