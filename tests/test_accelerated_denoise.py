"""The sampler's denoiser factory (nodes/ltx/accelerated_denoise.py): mode resolution, refusal of CUDA graphs off
CUDA, eager = `transformer.denoise` bit for bit, the static-buffer graph path (run on the CPU with the capture
replaced by a plain call), torch.compile of the blocks, and the sampler node's `acceleration` input."""
from __future__ import annotations

import pytest
import torch

from nodes.comfy.handles import Loaded
from nodes.ltx.dit import accelerated_denoise as A
from nodes.ltx.dit import transformer as T
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.errors import LTX25Error
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent

VIDEO, AUDIO = (1, 128, 3, 2, 2), (1, 8, 5, 16)
VIDEO2 = (1, 128, 3, 4, 4)   # a second shape (stage 2 doubles H and W)
VIDEO3, AUDIO3 = (1, 128, 2, 3, 5), (1, 8, 4, 16)   # a third: a new resolution and frame count (so audio length)


def latents(shape=VIDEO, seed: int = 0, audio_shape=AUDIO):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(audio_shape, generator=g)


def conditioning(seed: int = 0) -> Conditioning:
    g = torch.Generator().manual_seed(100 + seed)
    return Conditioning(torch.randn(1, 1024, 64, generator=g), torch.randn(1, 1024, 32, generator=g))


def max_diff(got, want) -> float:
    return max((a - b).abs().max().item() for a, b in zip(got, want))


# ---------------------------------------------------------------------------------------------------- modes
def test_auto_is_cuda_graph_on_cuda_and_eager_elsewhere():
    """'auto' picks the graph only where one can be captured; explicit modes pass through unchanged."""
    assert A.resolve_mode("auto", torch.device("cpu")) == "eager"
    assert A.resolve_mode("auto", torch.device("cuda", 0)) == "cuda_graph"
    assert A.resolve_mode("compile_cuda_graph", torch.device("cuda")) == "compile_cuda_graph"
    assert A.resolve_mode("eager", torch.device("cuda")) == "eager"
    assert set(A.ACCELERATIONS) <= {"auto", *A.MODES}


@pytest.mark.parametrize("mode", ["cuda_graph", "compile_cuda_graph"])
def test_explicit_graph_mode_off_cuda_is_refused(transformer, mode):
    """Asking for a CUDA graph with the model on the CPU is an error naming the device and the way out ('auto'),
    not a silent fallback to eager."""
    with pytest.raises(LTX25Error, match="CUDA") as info:
        A.make_denoiser(transformer, conditioning(), 24.0, mode)
    assert info.value.where == "acceleration" and "cpu" in str(info.value) and "auto" in str(info.value)
    assert f"the mode is '{mode}' with the model on the cpu, expected a CUDA device" in str(info.value)


def test_unknown_mode_is_refused(transformer):
    """A typo is refused listing the modes."""
    with pytest.raises(LTX25Error, match="cuda_graph"):
        A.make_denoiser(transformer, conditioning(), 24.0, "graph")


def test_eager_denoiser_equals_transformer_denoise_bit_exactly(transformer):
    """'auto' on the CPU (eager) is `transformer.denoise` itself: the same bits, float32, inference tensors."""
    video, audio = latents()
    cond = conditioning()
    got = A.make_denoiser(transformer, cond, 24.0, "auto")(video, audio, 0.725)
    want = T.denoise(transformer, video, audio, 0.725, cond, 24.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), f"max diff {max_diff(got, want)}"
    assert got[0].dtype == torch.float32 and got[0].is_inference()


@pytest.mark.parametrize("capability, cudnn, env, enabled, want", [
    ((9, 0), 91501, None, True, "CUDNN_ATTENTION"),    # H100 / H200, cuDNN 9.15.1
    ((10, 0), 91600, None, True, "CUDNN_ATTENTION"),   # B200
    ((10, 3), 91600, None, True, "CUDNN_ATTENTION"),   # B300
    ((9, 0), 91500, None, True, None),      # 9.15.0 mishandles lengths that are not multiples of 128
    ((10, 1), 91600, None, True, None),     # a minor version torch does not list
    ((8, 9), 91600, None, True, None),      # RTX 40xx: torch keeps FlashAttention first
    ((12, 0), 91600, None, True, None),     # RTX 50xx likewise
    ((9, 0), None, None, True, None),       # no cuDNN
    ((9, 0), 91600, "1", True, None),       # the user asked torch to deprioritize cuDNN
    ((9, 0), 91600, "true", True, "CUDNN_ATTENTION"),  # torch reads only "1" as set
    ((9, 0), 91600, None, False, None),     # the user switched cuDNN attention off
])
def test_preferred_attention_is_the_kernel_torch_puts_first(monkeypatch, capability, cudnn, env, enabled, want):
    """The kernel the non-compiled modes enter around each DiT call: the one torch itself picks first on that GPU,
    so that a process whose SDPA order another node left undecided (ComfyUI core's attention can, module docstring)
    runs the pack's DiT as a fresh one would. Fails if the pack forces cuDNN where torch would not, or drops it."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: cudnn is not None)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: cudnn)
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: enabled)
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
    if env:
        monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", env)
    assert A.preferred_attention(torch.device("cuda", 0)) == want
    assert A.preferred_attention(torch.device("cpu")) is None


@pytest.mark.parametrize("mode", ["eager", "cuda_graph"])
def test_denoiser_runs_under_the_preferred_kernel_whatever_order_the_process_was_left_in(transformer, monkeypatch,
                                                                                        recorded, mode):
    """A process whose first attention ran inside ComfyUI core's `sdpa_kernel(..., set_priority=True)` keeps
    FlashAttention first for good (1.435 against 1.219 s a stage-2 step at 1280×704 on an H200). A denoiser of
    every non-compiled mode runs the DiT under the preferred kernel, whatever order it finds, after making torch
    decide its own order once, and leaves the process's order as it found it. Run with MATH standing in for cuDNN
    and the CPU for the device (no GPU here; the graph's capture is a plain call). Fails if the DiT call is not
    wrapped, the order leaks out of it, or torch is not made to decide first."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    math = int(SDPBackend.MATH)
    monkeypatch.setattr(A, "preferred_attention", lambda device: "MATH")
    monkeypatch.setattr(A, "resolve_mode", lambda m, device, where="": m)  # graph modes on the CPU
    decided = []
    monkeypatch.setattr(A, "_decide_order", lambda device: decided.append(device))
    seen = []
    hook = transformer.dit.register_forward_pre_hook(
        lambda module, args: seen.append(torch._C._get_sdp_priority_order()[0]))
    flash_first = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        with sdpa_kernel(flash_first, set_priority=True):  # the order core's attention leaves behind
            before = list(torch._C._get_sdp_priority_order())
            A.make_denoiser(transformer, conditioning(), 24.0, mode)(*latents(), 0.725)
            assert list(torch._C._get_sdp_priority_order()) == before
    finally:
        hook.remove()
    assert seen and set(seen) == {math}, seen
    assert decided == [next(transformer.parameters()).device]


def test_torch_decides_its_attention_order_once_before_the_first_context(monkeypatch):
    """`_decide_order` runs one tiny attention call per CUDA device and process, outside any context: torch then
    settles its order before the denoiser's context could leave it undecided. Nothing runs off CUDA."""
    calls = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda q, k, v: calls.append(q.shape))
    monkeypatch.setattr(torch, "zeros", lambda *shape, **kw: torch.empty(*shape))  # no CUDA tensor here
    monkeypatch.setattr(A, "_DECIDED", set())
    A._decide_order(torch.device("cpu"))
    assert calls == []
    A._decide_order(torch.device("cuda", 0))
    A._decide_order(torch.device("cuda", 0))
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------------- graph path
@pytest.fixture
def recorded(monkeypatch):
    """The capture replaced by 'replay = call the forward on the static buffers' (no CUDA here); counts captures."""
    captures = []

    def record(forward, cache, device):
        captures.append(forward)
        return forward
    monkeypatch.setattr(A, "_record", record)
    return captures


def test_static_buffers_follow_new_latents_sigma_and_conditioning(transformer, recorded):
    """The graph path copies latents, σ AND the text context into its static buffers every call: a new prompt,
    σ or latent on a cached shape gives exactly `transformer.denoise`'s x0, and each shape is captured once.
    Fails if the context is captured once (the graph would keep answering the first prompt)."""
    A.release(transformer)
    denoise_a = A._graph_denoiser(transformer, conditioning(0), 24.0, A.MODES["cuda_graph"])
    denoise_b = A._graph_denoiser(transformer, conditioning(1), 24.0, A.MODES["cuda_graph"])
    for denoise, cond in ((denoise_a, conditioning(0)), (denoise_b, conditioning(1)), (denoise_a, conditioning(0))):
        for shape, seed, sigma in ((VIDEO, 0, 1.0), (VIDEO, 1, 0.421875), (VIDEO2, 2, 0.725)):
            video, audio = latents(shape, seed)
            got, want = denoise(video, audio, sigma), T.denoise(transformer, video, audio, sigma, cond, 24.0)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{shape} σ={sigma}: {max_diff(got, want)}"
    assert len(recorded) == 2, f"{len(recorded)} captures for 2 shapes"


def test_moved_weights_drop_the_graphs(transformer, recorded):
    """A graph replays fixed weight addresses: after model management moves a weight (offload + reload gives new
    storage), the next call captures again instead of replaying freed memory, even a call of a denoiser made
    before the move (model management may move the model mid-run)."""
    A.release(transformer)
    video, audio = latents()
    denoise = A._graph_denoiser(transformer, conditioning(), 24.0, A.MODES["cuda_graph"])
    denoise(video, audio, 0.5)
    A._graph_denoiser(transformer, conditioning(), 24.0, A.MODES["cuda_graph"])(video, audio, 0.5)
    assert len(recorded) == 1, "the same weights captured twice"
    weight = transformer.dit.transformer_blocks[1].ff.net[2].weight
    weight.data = weight.data.clone()
    denoise(video, audio, 0.5)
    assert len(recorded) == 2, "stale graph kept after a weight moved"
    A.release(transformer)


def test_a_model_whose_blocks_stream_drops_the_graphs_captured_while_it_was_resident(deep_transformer, recorded):
    """Graphs kept beside the weights (a reload that leaves them in place keeps them) are never replayed while the
    blocks stream: the next denoiser drops them, so their pool does not sit beside the streamed weights."""
    import copy
    from nodes.comfy import bridge
    from nodes.ltx import streaming
    model = copy.deepcopy(deep_transformer)
    handle = Loaded(model, bridge.make_patcher(model), None)  # no release hook: only the denoiser drops them
    video, audio = latents()
    A._graph_denoiser(handle.ready(), conditioning(), 24.0, A.MODES["cuda_graph"])(video, audio, 0.5)
    assert len(recorded) == 1 and "_ltx25_graphs" in vars(model)
    A.make_denoiser(model, conditioning(), 24.0, "auto")  # resident: kept
    assert "_ltx25_graphs" in vars(model)
    bridge.unload_model(handle.patcher)
    bridge.set_vram_budget_gb((bridge.module_bytes(model) - 1) / 2**30)
    try:
        handle.ready()
        assert streaming.is_streaming(model)
        A.make_denoiser(model, conditioning(), 24.0, "auto")
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(handle.patcher)
    assert "_ltx25_graphs" not in vars(model)


@pytest.mark.parametrize("guided", [False, True], ids=["plain", "guided"])
def test_a_graph_denoiser_runs_eagerly_once_the_blocks_start_streaming_mid_run(deep_transformer, monkeypatch, guided):
    """In ComfyUI the bridge loads the model again between steps when a preview's model evicted part of it, and the
    reload may stream blocks: the same denoiser's next calls must neither capture nor replay a graph (the streamer's
    copies cannot be captured and a graph would bake one slot's weights), and give the eager x0. Fails if the check
    is made only when the denoiser is made."""
    import copy
    from nodes.comfy import bridge
    from nodes.ltx import streaming
    from nodes.ltx.dit import guidance as G
    model = copy.deepcopy(deep_transformer)
    graph_calls = []

    def record(forward, cache, device):
        graph_calls.append(streaming.is_streaming(model))

        def replay():
            graph_calls.append(streaming.is_streaming(model))
            return forward()
        return replay
    monkeypatch.setattr(A, "_record", record)
    monkeypatch.setattr(A, "resolve_mode", lambda mode, device, where="": "cuda_graph")  # no CUDA here
    cond = conditioning()
    if guided:
        guidance = G.Guidance(cond, conditioning(1), G.ModalityGuidance(cfg=3.0), G.ModalityGuidance())
        make = lambda m: G.make_guided_denoiser(m, guidance, 24.0, "cuda_graph")  # noqa: E731
    else:
        make = lambda m: A.make_denoiser(m, cond, 24.0, "cuda_graph")  # noqa: E731
    handle = Loaded(model, bridge.make_patcher(model), None)
    video, audio = latents()
    denoise = make(handle.ready())
    denoise(video, audio, 0.5)
    assert graph_calls and not any(graph_calls), "the resident model took the graph path"
    bridge.unload_model(handle.patcher)
    bridge.set_vram_budget_gb((bridge.module_bytes(model) - 1) / 2**30)
    try:
        handle.ready()
        assert streaming.is_streaming(model)
        graph_calls.clear()
        got = denoise(video, audio, 0.4)
        monkeypatch.setattr(A, "resolve_mode", lambda mode, device, where="": "eager")
        want = make(model)(video, audio, 0.4)
    finally:
        bridge.set_vram_budget_gb(None)
        bridge.unload_model(handle.patcher)
    assert graph_calls == [], f"graph captures/replays while the blocks stream: {graph_calls}"
    assert all(torch.equal(a, b) for a, b in zip(got, want)), max_diff(got, want)


# ---------------------------------------------------------------------------------------------------- compile
def test_compile_mode_compiles_once_per_model_and_eager_stays_eager(transformer_path, monkeypatch, tmp_path):
    """'compile' runs `compile_repeated_blocks(**COMPILE_OPTIONS)` once per model, after the compile caches point at
    the pack's folder, and gives eager's x0. The blocks' token counts are symbolic from the first call
    (`TOKEN_INPUTS`): the first shape traces once, and stage 2 (twice the resolution), the first shape again and a
    third shape (a new resolution AND frame count, so another audio length) add no graph; a later eager denoiser on
    the same model runs the plain blocks again. A counting Dynamo backend that runs the traced graph eagerly stands
    in for Inductor, whose cold C++ build takes ~30 s on 2 cores (Inductor measured here by hand: max |Δx0| 2.4e-7
    in float32). Fails if stage 2 compiles again (Dynamo's automatic dynamic shapes alone: static, then dynamic), if
    a new frame count does (the audio's token count left static, as stage 2 does not change it) or if the caches are
    set after the compile starts."""
    from nodes.ltx import compile_cache
    monkeypatch.setattr(compile_cache, "_applied", None)
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    for name in (compile_cache.INDUCTOR_ENV, compile_cache.TRITON_ENV):
        monkeypatch.delenv(name, raising=False)
    transformer = T.load_transformer(transformer_path, torch.float32)
    video, audio = latents()
    cond = conditioning()
    want = T.denoise(transformer, video, audio, 0.725, cond, 24.0)
    calls, graphs = [], []

    def counting_backend(graph_module, _example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def compile_blocks(**options):
        import os
        calls.append((options, os.environ.get(compile_cache.INDUCTOR_ENV), os.environ.get(compile_cache.TRITON_ENV)))
        original(**options, backend=counting_backend)
    original = transformer.dit.compile_repeated_blocks
    monkeypatch.setattr(transformer.dit, "compile_repeated_blocks", compile_blocks)
    blocks = transformer.dit.transformer_blocks
    try:
        got = A.make_denoiser(transformer, cond, 24.0, "compile")(video, audio, 0.725)
        traced = len(graphs)
        A.make_denoiser(transformer, cond, 24.0, "compile")(video, audio, 0.725)
        A.make_denoiser(transformer, cond, 24.0, "compile")(*latents(VIDEO2, 1), 0.725)
        after_second = len(graphs)
        A.make_denoiser(transformer, cond, 24.0, "compile")(video, audio, 0.5)
        new_video, new_audio = latents(VIDEO3, 2, AUDIO3)
        got_new = A.make_denoiser(transformer, cond, 24.0, "compile")(new_video, new_audio, 0.725)
        assert [c[0] for c in calls] == [A.COMPILE_OPTIONS], f"compiled {len(calls)} times"
        assert calls[0][1:] == (str(tmp_path / "inductor"), str(tmp_path / "triton")), \
            f"cache folders when the compile started: {calls[0][1:]}"
        assert traced == 1, f"the first call traced {traced} graphs (one expected: 2 blocks share it, no break)"
        assert after_second == traced, f"stage 2's resolution compiled {after_second - traced} graph(s) again"
        assert len(graphs) == after_second, f"a new frame count compiled {len(graphs) - after_second} graph(s)"
        assert all(b._compiled_call_impl is not None for b in blocks), "compile mode ran uncompiled blocks"
        assert max_diff(got, want) < 1e-5, f"max diff {max_diff(got, want)}"
        want_new = T.denoise(transformer, new_video, new_audio, 0.725, cond, 24.0)
        assert max_diff(got_new, want_new) < 1e-5, f"new shape: max diff {max_diff(got_new, want_new)}"
        again = A.make_denoiser(transformer, cond, 24.0, "eager")(video, audio, 0.725)
        assert all(b._compiled_call_impl is None for b in blocks), "eager mode ran the compiled blocks"
        assert all(torch.equal(a, b) for a, b in zip(again, want)), f"eager after compile: {max_diff(again, want)}"
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["compile", "compile_cuda_graph"])
def test_a_compile_that_fails_names_the_acceleration_and_leaves_the_blocks_plain(transformer_path, monkeypatch, mode):
    """Without a working Triton or C compiler Inductor fails inside the first step: the user gets an error naming
    `acceleration` and the mode with what to choose instead, the blocks run plain again (an eager denoiser works
    after it) and a retry announces a compile again (not 'capturing', as if the compile had succeeded). Fails if
    the compiled state is recorded before the compile is known to work."""
    monkeypatch.setattr(A, "resolve_mode", lambda m, device, where="": m)  # graph modes on the CPU: replay = forward

    def record(forward, cache, device):
        forward()  # the warm-up, where the first compile happens
        return forward
    monkeypatch.setattr(A, "_record", record)
    transformer = T.load_transformer(transformer_path, torch.float32)

    def no_compiler(graph_module, _example_inputs):
        raise RuntimeError("Cannot find a working triton installation")
    original = transformer.dit.compile_repeated_blocks
    monkeypatch.setattr(transformer.dit, "compile_repeated_blocks",
                        lambda **options: original(**options, backend=no_compiler))
    video, audio = latents()
    heard = []
    try:
        for _ in range(2):
            with pytest.raises(LTX25Error) as error:
                A.make_denoiser(transformer, conditioning(), 24.0, mode, notify=heard.append)(video, audio, 0.5)
            assert error.value.where == "acceleration" and repr(mode) in str(error.value), str(error.value)
            assert "working triton" in str(error.value) and "'cuda_graph'" in str(error.value), str(error.value)
        assert [line.split(" (")[0] for line in heard] == ["LTX-2.5 sampler: compiling the transformer blocks for "
                                                           f"{A.describe_shape(VIDEO)}"] * 2, heard
        assert all(b._compiled_call_impl is None for b in transformer.dit.transformer_blocks)
        got = A.make_denoiser(transformer, conditioning(), 24.0, "eager")(video, audio, 0.5)
        want = T.denoise(transformer, video, audio, 0.5, conditioning(), 24.0)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), max_diff(got, want)
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------- the node
def test_sampler_node_takes_acceleration_last_with_auto_default(transformer_path):
    """`acceleration` is the last required input with default 'auto' (older graphs keep working); on the CPU 'auto'
    and 'eager' give the same latents and 'cuda_graph' is refused by the node's field before the model loads."""
    required = LTX25DistilledSampler.INPUT_TYPES()["required"]
    assert list(required)[-1] == "acceleration"
    assert required["acceleration"][0] == list(A.ACCELERATIONS) and required["acceleration"][1]["default"] == "auto"
    handle = Loaded.register(T.load_transformer(transformer_path, torch.float32), inspect_asset(transformer_path))
    cond = conditioning()

    def run(acceleration):
        video, audio = LTX25EmptyLatent().make(128, 64, 9, 24.0, 1, False)
        return LTX25DistilledSampler().sample(handle, cond, video, audio, 1, "1", "auto", 1.0, "1.0, 0.7, 0.0",
                                              acceleration=acceleration)
    (v1, a1), (v2, a2) = run("auto"), run("eager")
    assert torch.equal(v1["samples"], v2["samples"]) and torch.equal(a1["samples"], a2["samples"])
    from nodes.comfy import bridge
    bridge.unload_model(handle.patcher)
    with pytest.raises(LTX25Error, match="CUDA") as error:
        run("cuda_graph")
    assert error.value.where == "LTX25DistilledSampler.acceleration", error.value.where
    assert not handle.patcher.is_loaded(), "refused after loading the transformer"


def test_the_node_text_names_a_clip_by_pixels_and_a_token_row_by_its_tokens():
    from nodes.ltx.dit.accelerated_denoise import describe_shape
    assert describe_shape((1, 128, 16, 16, 24)) == "768×512×121"
    assert describe_shape((2, 128, 16, 16, 24)) == "768×512×121, 2 clips"
    assert describe_shape((1, 128, 1, 1, 448), tokens=True) == "448 latent tokens"  # holding an IC-LoRA reference
    assert describe_shape((1, 128, 1, 1, 24)) == "768×32×1"  # a real one-frame clip 32 px high stays a clip
