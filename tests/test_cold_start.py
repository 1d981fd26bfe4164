"""Cold start (issue 24): where compiled code is kept (nodes/ltx/compile_cache.py), what the sampler tells the user
while it compiles or captures (nodes/ltx/dit/accelerated_denoise.py, through the bridge's node text), and the audio
decode's cuDNN setting. That a second shape compiles nothing is pinned in test_accelerated_denoise.py (it shares
that test's one Dynamo trace); the seconds are bench/bench_cold_start.py's."""
from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent
from nodes.ltx import audio_vae as av
from nodes.ltx import compile_cache as cc
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import accelerated_denoise as A
from nodes.ltx.files.assets import inspect_asset

VIDEO, VIDEO2, AUDIO = (1, 128, 3, 2, 2), (1, 128, 3, 4, 4), (1, 8, 5, 16)


@pytest.fixture
def clean_env(monkeypatch):
    """No cache variable set and nothing applied yet; every change undone afterwards."""
    for name in (cc.ENV, cc.INDUCTOR_ENV, cc.TRITON_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cc, "_applied", None)
    monkeypatch.setattr(cc, "_host_root", cc._host_root)
    return monkeypatch


# ---------------------------------------------------------------------------------------------------- the folder
def test_cache_root_is_the_env_var_then_comfyui_user_dir_then_the_users_cache():
    """LTX25_CACHE_DIR wins everywhere (`off` keeps torch's own places); otherwise ComfyUI's user directory (it
    survives restarts, unlike its temp folder); headless $XDG_CACHE_HOME/ltx25, else ~/.cache/ltx25."""
    home = os.path.abspath("/home/u")
    assert cc.choose_root({cc.ENV: "/fast/ltx"}, "/comfy/user", home) == (os.path.abspath("/fast/ltx"), cc.ENV)
    assert cc.choose_root({cc.ENV: " OFF "}, "/comfy/user", home)[0] is None
    assert cc.choose_root({}, "/comfy/user", home) == (os.path.join(os.path.abspath("/comfy/user"), "ltx25_cache"),
                                                        "ComfyUI user directory")
    assert cc.choose_root({"XDG_CACHE_HOME": "/xdg"}, None, home)[0] == os.path.join(os.path.abspath("/xdg"), "ltx25")
    assert cc.choose_root({}, None, home)[0] == os.path.join(home, ".cache", "ltx25")


def test_apply_keeps_folders_the_user_chose_but_not_torchs_fallback(tmp_path):
    """A TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR the user set stays; one holding Inductor's own fallback (importing
    torch._dynamo writes it there) is replaced; `off` changes nothing."""
    root = str(tmp_path / "c")
    env = {cc.INDUCTOR_ENV: "/tmp/torchinductor_u"}
    dirs = cc.apply(root, "test", env, torch_default="/tmp/torchinductor_u")
    assert env == {cc.INDUCTOR_ENV: os.path.join(root, "inductor"), cc.TRITON_ENV: os.path.join(root, "triton")}
    assert (dirs.inductor, dirs.triton) == (env[cc.INDUCTOR_ENV], env[cc.TRITON_ENV]) and os.path.isdir(root)
    mine = {cc.INDUCTOR_ENV: "/mine/inductor", cc.TRITON_ENV: "/mine/triton"}
    cc.apply(root, "test", mine, torch_default="/tmp/torchinductor_u")
    assert mine == {cc.INDUCTOR_ENV: "/mine/inductor", cc.TRITON_ENV: "/mine/triton"}
    untouched = {}
    assert cc.apply(None, "off", untouched).root is None and untouched == {}


def test_under_comfyui_the_cache_goes_to_its_user_directory(clean_env, tmp_path):
    """The bridge registers ComfyUI's user directory at import; the first compilation applies it (asked then, so
    ComfyUI's --user-directory is already parsed) and sets both torch's and Triton's variables."""
    user = tmp_path / "user"
    clean_env.setattr(bridge.folders, "HAS_COMFY", True)
    clean_env.setattr(bridge.folders, "_folder_paths", types.SimpleNamespace(get_user_directory=lambda: str(user)),
                      raising=False)
    cc.set_host_root(bridge.user_directory)
    dirs = cc.ensure_applied()
    assert dirs.root == str(user / "ltx25_cache") and dirs.chosen_by == "ComfyUI user directory"
    assert os.environ[cc.INDUCTOR_ENV] == str(user / "ltx25_cache" / "inductor")
    assert os.environ[cc.TRITON_ENV] == str(user / "ltx25_cache" / "triton")
    assert cc.ensure_applied() is dirs, "applied twice"


def test_headless_the_env_var_decides_and_the_bridge_offers_no_folder(clean_env, tmp_path):
    """Headless, the bridge offers no host folder, and LTX25_CACHE_DIR is where everything goes."""
    clean_env.setattr(bridge.folders, "HAS_COMFY", False)
    clean_env.setenv(cc.ENV, str(tmp_path / "mine"))
    cc.set_host_root(bridge.user_directory)
    assert bridge.user_directory() is None
    assert cc.ensure_applied().root == str(tmp_path / "mine")
    assert os.environ[cc.TRITON_ENV] == str(tmp_path / "mine" / "triton")


def test_the_pack_registers_the_bridges_folder_at_import():
    """Importing the bridge is what hands ComfyUI's folder to the engine (the engine cannot import the bridge)."""
    assert cc._host_root is bridge.user_directory


# ---------------------------------------------------------------------------------------------------- node text
@pytest.fixture
def fake_compiled_graphs(clean_env, tmp_path):
    """compile_cuda_graph made runnable on the CPU: no capture (the forward is called), no cuDNN context, and a
    compile that only records when it ran (the test is about what is said, and when)."""
    clean_env.setenv(cc.ENV, str(tmp_path / "cache"))
    clean_env.setitem(A.MODES, "compile_cuda_graph", A.Mode(graph=True, compile=True, attention=None))
    clean_env.setattr(A, "resolve_mode", lambda mode, device, where="": "compile_cuda_graph")
    events: list = []

    def record(forward, cache, device):
        events.append("capture")
        return forward
    clean_env.setattr(A, "_record", record)
    return events


def conditioning() -> Conditioning:
    g = torch.Generator().manual_seed(3)
    return Conditioning(torch.randn(1, 1024, 64, generator=g), torch.randn(1, 1024, 32, generator=g))


def test_sampler_says_it_compiles_before_it_does_and_what_a_new_shape_costs(transformer, fake_compiled_graphs):
    """First call: 'compiling … for 64×64×17' BEFORE the compile starts, naming the cache folder, then 'compiled …
    in N s'; the same shape again: nothing said; a new shape: 'capturing a CUDA graph … for 128×128×17', no second
    compile. Fails if the line comes after the compile (the user would stare at a silent node) or if every call
    talks."""
    events = fake_compiled_graphs
    A.release(transformer)
    vars(transformer).pop("_ltx25_compiled", None)
    transformer.dit.compile_repeated_blocks = lambda **options: events.append("compile")  # an instance attribute
    try:
        lines = []
        denoise = A.make_denoiser(transformer, conditioning(), 24.0, "compile_cuda_graph",
                                  notify=lambda line: (lines.append(line), events.append("said")))
        g = torch.Generator().manual_seed(0)
        for shape in (VIDEO, VIDEO, VIDEO2):
            denoise(torch.randn(shape, generator=g), torch.randn(AUDIO, generator=g), 0.725)
    finally:
        del transformer.dit.compile_repeated_blocks
        vars(transformer).pop("_ltx25_compiled", None)
        A.release(transformer)
    assert events == ["said", "compile", "capture", "said", "said", "capture", "said"], events
    assert lines[0].startswith("LTX-2.5 sampler: compiling the transformer blocks for 64×64×17 (first use")
    assert cc.applied().root in lines[0], lines[0]
    assert lines[1].startswith("LTX-2.5 sampler: transformer blocks compiled for 64×64×17 in ") and \
        lines[1].endswith(" s"), lines[1]
    assert lines[2].startswith("LTX-2.5 sampler: capturing a CUDA graph of the compiled transformer for 128×128×17")


def test_sampler_node_shows_the_compile_on_the_node(transformer_path, fake_compiled_graphs, monkeypatch):
    """The sampler node hands the bridge's node text to the engine: its compile line reaches `show_on_node`."""
    from nodes.ltx.dit.transformer import load_transformer
    shown = []
    monkeypatch.setattr(bridge, "show_on_node", shown.append)
    handle = Loaded.register(load_transformer(transformer_path, torch.float32), inspect_asset(transformer_path))
    monkeypatch.setattr(handle.module.dit, "compile_repeated_blocks", lambda **options: None, raising=False)
    video, audio = LTX25EmptyLatent().make(128, 64, 9, 24.0, 1, False)
    LTX25DistilledSampler().sample(handle, conditioning(), video, audio, 1, "1", "auto", 1.0, "1.0, 0.7, 0.0",
                                   acceleration="compile_cuda_graph")
    assert any(line.startswith("LTX-2.5 sampler: compiling the transformer blocks for 128×64×9") for line in shown), \
        shown


def test_show_on_node_sends_comfyuis_progress_text_to_the_running_node(monkeypatch):
    """Under ComfyUI (faked: the executing context and the server) the line goes to the node being executed, as
    ComfyUI's progress text, so the compile message appears under the sampler while it compiles."""
    sent = []
    server = types.SimpleNamespace(send_progress_text=lambda text, node_id: sent.append((text, node_id)))
    monkeypatch.setattr(bridge.node_text, "HAS_COMFY", True)
    monkeypatch.setitem(sys.modules, "server", types.SimpleNamespace(PromptServer=types.SimpleNamespace(
        instance=server)))
    monkeypatch.setitem(sys.modules, "comfy_execution", types.ModuleType("comfy_execution"))
    monkeypatch.setitem(sys.modules, "comfy_execution.utils", types.SimpleNamespace(
        get_executing_context=lambda: types.SimpleNamespace(node_id="10")))
    bridge.show_on_node("LTX-2.5 sampler: compiling …")
    assert sent == [("LTX-2.5 sampler: compiling …", "10")]


# ---------------------------------------------------------------------------------------------------- restart
def test_attention_kernel_is_limited_around_the_compiled_blocks_not_inside_them(transformer_path, monkeypatch):
    """compile_cuda_graph limits SDPA to cuDNN around each call, outside the compiled blocks, so Dynamo's graph of
    a block holds no call into `torch.nn.attention`. diffusers' `_native_cudnn` backend sets the same limit inside
    every attention call instead; Dynamo records those private calls in the graph, and AOTAutograd then skips its
    on-disk cache at every start (bench_cold_start.py's `in_graph_*` scenarios). Run with the MATH kernel (cuDNN
    needs a GPU) and a counting backend standing in for Inductor. Fails if the limit moves back inside the blocks
    or is not in force while the blocks are traced (the kernel is chosen then)."""
    from nodes.ltx.dit.transformer import load_transformer
    assert A.MODES["compile_cuda_graph"] == A.Mode(graph=True, compile=True, attention="CUDNN_ATTENTION")
    monkeypatch.setitem(A.MODES, "compile", A.Mode(graph=False, compile=True, attention="MATH"))
    transformer = load_transformer(transformer_path, torch.float32)
    graphs, first_kernel = [], []

    def counting_backend(graph_module, _example_inputs):
        graphs.append(graph_module)
        first_kernel.append(torch._C._get_sdp_priority_order()[0])
        return graph_module.forward
    original = transformer.dit.compile_repeated_blocks
    monkeypatch.setattr(transformer.dit, "compile_repeated_blocks",
                        lambda **options: original(**options, backend=counting_backend))
    try:
        A.make_denoiser(transformer, conditioning(), 24.0, "compile")(torch.randn(VIDEO), torch.randn(AUDIO), 0.725)
    finally:
        torch._dynamo.reset()
    calls = [node.target for g in graphs for node in g.graph.nodes if node.op == "call_function"]
    assert graphs and any("scaled_dot_product_attention" in str(target) for target in calls), "no attention traced"
    inside = [str(t) for t in calls if getattr(t, "__module__", None) == "torch.nn.attention"]
    assert not inside, f"the SDPA limit is set inside the compiled blocks: {inside}"
    math = int(torch.nn.attention.SDPBackend.MATH)
    assert first_kernel == [math] * len(graphs), "the blocks were traced without the mode's kernel first"


# ---------------------------------------------------------------------------------------------------- audio
def test_audio_decode_runs_with_cudnn_benchmarking_off_and_restores_it(tiny_file, monkeypatch):
    """Inside the audio decode cuDNN goes by its heuristics even when benchmarking is on outside (each of the
    vocoder's ~150 convolution shapes would otherwise be benchmarked on first use); the outside setting comes
    back afterwards, also after an error. Fails if the vocoder runs under the caller's benchmark flag."""
    vae = av.load_audio_vae(tiny_file("audio_vae"), torch.float32)
    seen = []  # the flag each stage ran under; the stages' math is not the point (test_audio_vae.py pins it)
    monkeypatch.setattr(vae.decoder, "forward", lambda z: (seen.append(torch.backends.cudnn.benchmark),
                                                           torch.zeros(1, 2, 1, 64))[1])
    monkeypatch.setattr(vae.vocoder, "forward", lambda mel: (seen.append(torch.backends.cudnn.benchmark),
                                                             torch.zeros(1, 2, 480))[1])
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        av.decode_audio(vae, torch.zeros(1, 8, 1, 16))
        assert seen == [False, False], f"benchmark flag inside the decoder and vocoder: {seen}"
        assert torch.backends.cudnn.benchmark is True, "the caller's flag was not restored"
        with pytest.raises(RuntimeError):
            with av.cudnn_heuristics():
                raise RuntimeError("boom")
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before
