"""Neighborhood-attention processors: the exact SDPA reference against a dense brute force, NATTEN (flex, CPU)
and comfy_kitchen (eager, CPU); border windows; the `auto` decision; refusals of unavailable backends."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from nodes.ltx import compat
from nodes.ltx.kernels import na_attention as na
from nodes.ltx.errors import LTX25Error

CASES = [  # (q shape [B, T, H, W, heads, D], kernel, spatial query block)
    ((1, 6, 8, 8, 2, 16), (3, 5, 5), (8, 8)),
    ((2, 7, 9, 11, 3, 8), (3, 3, 5), (4, 3)),
    ((1, 11, 11, 12, 1, 8), (11, 11, 11), (8, 8)),      # kernel = axis: every window is the whole axis
    ((1, 5, 13, 6, 2, 8), (5, 7, 3), (5, 4)),           # blocks that do not divide the axes
    ((1, 14, 6, 5, 2, 8), (5, 3, 3), (2, 2)),           # interior frames, both border runs, 9 spatial classes
    ((2, 3, 4, 4, 1, 8), (3, 3, 3), (2, 3)),            # kernel = T: one centered frame, batch of 2
]


def _qkv(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(3)]


def _dense_reference(q, k, v, kernel):
    """Full attention with an explicit window mask built from `window_start` (the NATTEN rule)."""
    b, t, h, w, heads, d = q.shape

    def axis(n, kk):
        s = torch.tensor([na.window_start(i, n, kk) for i in range(n)])
        j = torch.arange(n)
        return (j[None] >= s[:, None]) & (j[None] < s[:, None] + kk)

    m = (axis(t, kernel[0])[:, None, None, :, None, None] & axis(h, kernel[1])[None, :, None, None, :, None]
         & axis(w, kernel[2])[None, None, :, None, None, :]).reshape(t * h * w, t * h * w)
    flat = [x.reshape(b, t * h * w, heads, d).transpose(1, 2) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*flat, attn_mask=m, scale=1.0).transpose(1, 2).reshape(q.shape)


@pytest.mark.parametrize("shape,kernel,block", CASES)
def test_sdpa_equals_dense_window_attention(shape, kernel, block):
    """The blocked SDPA processor is exact: float64 agreement with dense attention under the explicit NATTEN
    window mask, for borders, kernel = axis, and query blocks that do not divide the grid."""
    q, k, v = _qkv(shape, torch.float64)
    got = na.na3d_sdpa(q, k, v, kernel, block)
    want = _dense_reference(q, k, v, kernel)
    assert torch.allclose(got, want, atol=1e-12), f"max diff {(got - want).abs().max():.3e}"


@pytest.mark.parametrize("shape,kernel,block", CASES)
def test_sdpa_natten_and_comfy_kitchen_agree(shape, kernel, block):
    """All three backends compute the same attention on random q/k/v (NATTEN via flex on the CPU,
    comfy_kitchen via its eager path), with `scale=1.0` for the pre-scaled query."""
    q, k, v = _qkv(shape)
    ref = na.na3d_sdpa(q, k, v, kernel, block)
    for processor in (na.NattenNAProcessor(), na.ComfyKitchenNAProcessor()):
        got = processor.na3d(q, k, v, kernel)
        assert torch.allclose(got, ref, atol=2e-5), f"{processor.name}: max diff {(got - ref).abs().max():.3e}"


def test_border_windows_shift_inward_never_truncate():
    """With uniform attention (q = 0) the output is the mean of the window's values; with v = the key's T index
    every query sees exactly k keys starting at clamp(i − k//2, 0, L − k). A truncated border window would
    average fewer, nearer keys."""
    t, kt = 9, 5
    q = torch.zeros(1, t, 3, 3, 1, 8)
    v = torch.arange(t, dtype=torch.float32).view(1, t, 1, 1, 1, 1).expand(1, t, 3, 3, 1, 8).contiguous()
    out = na.na3d_sdpa(q, torch.randn_like(q) * 0, v, (kt, 3, 3), (2, 2))
    starts = [min(max(i - kt // 2, 0), t - kt) for i in range(t)]
    assert starts[:3] == [0, 0, 0] and starts[-3:] == [4, 4, 4]
    want = torch.tensor([s + (kt - 1) / 2 for s in starts])
    got = out[0, :, 1, 1, 0, 0]
    assert torch.allclose(got, want), f"window means {got.tolist()} vs {want.tolist()}"


def test_chunking_and_block_shape_do_not_change_the_result():
    """Memory knobs only: tiny gather chunks and other query blocks give the same output."""
    q, k, v = _qkv((1, 9, 10, 12, 2, 8), torch.float64)
    ref = na.na3d_sdpa(q, k, v, (3, 5, 5), (8, 8))
    for block, chunk in [((1, 1), None), ((3, 7), 1000), ((10, 12), 1)]:
        got = na.na3d_sdpa(q, k, v, (3, 5, 5), block, chunk)
        assert torch.allclose(got, ref, atol=1e-12), f"{block}/{chunk}: {(got - ref).abs().max():.3e}"


def test_grid_smaller_than_the_kernel_is_refused():
    """NATTEN requires every axis ≥ its kernel (the decoder pads to guarantee it); the reference says so."""
    q, k, v = _qkv((1, 2, 8, 8, 1, 8))
    with pytest.raises(LTX25Error, match="kernel"):
        na.na3d_sdpa(q, k, v, (3, 3, 3))


@pytest.mark.parametrize("device,ck,natten,triton,want", [
    ("cpu", ("eager",), (True, False), False, "sdpa"),
    ("cpu", ("cuda", "triton", "eager"), (True, True), True, "sdpa"),
    ("cuda", ("cuda", "triton", "eager"), (False, False), True, "triton"),
    ("cuda", ("cuda", "triton", "eager"), (False, False), False, "comfy_kitchen+sdpa"),
    ("cuda", ("triton", "eager"), (True, False), False, "comfy_kitchen+sdpa"),
    ("cuda", ("eager",), (True, True), False, "sdpa"),
    ("cuda", (), (False, False), True, "triton"),
    ("cuda", (), (False, False), False, "sdpa"),
])
def test_auto_picks_the_fastest_measured(device, ck, natten, triton, want):
    """The auto gate itself, from the H200 measurements in docs/PERFORMANCE.md: on CUDA our Triton kernel when Triton
    is there (the fastest at every stage's window); else comfy_kitchen for small windows and blocked SDPA for 11³;
    blocked SDPA otherwise (comfy_kitchen's eager CPU path is slower); an explicit choice is always kept."""
    assert na.choose_processor("auto", device, ck, natten, triton) == want
    assert na.choose_processor("natten", device, ck, natten, triton) == "natten"  # an explicit choice is kept


def test_unavailable_backends_are_errors_not_fallbacks(monkeypatch):
    """A backend that cannot run says so (and what to do) instead of silently running another one."""
    with pytest.raises(LTX25Error, match="processor"):
        na.make_processor("flash", torch.device("cpu"))
    monkeypatch.setattr(na, "natten_status", lambda: (True, False))
    with pytest.raises(LTX25Error, match="libnatten"):
        na.make_processor("natten", torch.device("cuda"))
    monkeypatch.setattr(na, "natten_status", lambda: (False, False))
    with pytest.raises(LTX25Error, match="not installed"):
        na.make_processor("natten", torch.device("cpu"))
    monkeypatch.setattr(na, "comfy_kitchen_backends", lambda: ())
    with pytest.raises(LTX25Error, match="comfy_kitchen"):
        na.make_processor("comfy_kitchen", torch.device("cpu"))


def test_processors_on_cpu_resolve_to_the_installed_libraries():
    """Here (CPU, natten without libnatten, comfy_kitchen eager) auto is sdpa and sdpa and comfy_kitchen run;
    triton (its CPU path is Triton's interpreter, for tests only) and natten are refused by name."""
    cpu = torch.device("cpu")
    names = {p: na.make_processor(p, cpu).name for p in na.PROCESSORS if p not in ("triton", "natten")}
    assert names == {"auto": "sdpa", "sdpa": "sdpa", "comfy_kitchen": "comfy_kitchen"}
    with pytest.raises(LTX25Error, match="the triton processor is unavailable here \\(the device is cpu"):
        na.make_processor("triton", cpu, "LTX25DiffusionVAEDecode.processor")
    assert "eager" in na.comfy_kitchen_backends()


@pytest.mark.parametrize("libnatten", [False, True])
def test_natten_is_refused_on_the_cpu_saying_why_and_what_to_pick(monkeypatch, libnatten):
    """On the CPU natten runs uncompiled flex attention, which holds every score at once (GiBs and tens of
    seconds for a 128×128×9 clip; a ComfyUI server was OOM-killed at 256×192×25) and cannot be interrupted: it
    is refused before anything runs, even with libnatten installed (its kernels are CUDA only), naming the node's
    input, the reason and sdpa."""
    monkeypatch.setattr(na, "natten_status", lambda: (True, libnatten))
    with pytest.raises(LTX25Error) as error:
        na.make_processor("natten", torch.device("cpu"), "LTX25DiffusionVAEDecode.processor")
    message = str(error.value)
    assert message.startswith("LTX25DiffusionVAEDecode.processor: the natten processor is asked to run on the cpu")
    assert "flex attention" in message and "Pick sdpa" in message, message


def test_the_decode_node_refuses_natten_on_the_cpu_before_loading_the_weights(tiny_file, monkeypatch):
    """The node resolves its processor first: natten on the CPU fails without the VAE being made ready."""
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.comfy.handles import Loaded
    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.files.assets import inspect_asset
    path = tiny_file("diffusion_vae")
    handle = Loaded.register(dv.load_diffusion_vae(path, torch.float32), inspect_asset(path))
    monkeypatch.setattr(Loaded, "ready", lambda *a: pytest.fail("the weights were loaded before the refusal"))
    latent = {"samples": torch.zeros(1, 128, 2, 2, 2)}
    with pytest.raises(LTX25Error, match="natten processor is asked to run on the cpu"):
        LTX25DiffusionVAEDecode().decode(handle, latent, "natten", 0, 0, "auto", 80, 512, 40, 160, 0.0)


def test_processors_agree_on_the_tiny_decoder(tiny_file):
    """End to end through diffusers' attention modules (project_qkv, RoPE, pre-scaled q, to_out): the tiny decoder
    decodes the same video with comfy_kitchen as with sdpa; NATTEN (uncompiled flex on the CPU takes ~30 s for the
    stage-5 grid) is compared on the decoder's stages 1-3, which run every det-stage attention module."""
    from nodes.ltx.decode import diffusion_vae as dv
    from nodes.ltx.decode.tiling import TilingRequest
    vae = dv.load_diffusion_vae(tiny_file("diffusion_vae"), torch.float32)
    latent = torch.randn(1, 128, 3, 3, 3, generator=torch.Generator().manual_seed(0))
    ref, stats = dv.decode(vae, latent, processor="sdpa", request=TilingRequest("off"))
    got, ck_stats = dv.decode(vae, latent, processor="comfy_kitchen", request=TilingRequest("off"))
    assert (stats.processor, ck_stats.processor) == ("sdpa", "comfy_kitchen (eager)")
    assert torch.allclose(got, ref, atol=1e-4), f"comfy_kitchen: max diff {(got - ref).abs().max():.3e}"
    decoder = vae.model.decoder
    with torch.inference_mode():
        na.install_processor(vae.model, na.SdpaNAProcessor())
        ref = compat.stages_1_to_3_before_last_upsample(decoder, latent)
        na.install_processor(vae.model, na.NattenNAProcessor())
        got = compat.stages_1_to_3_before_last_upsample(decoder, latent)
    assert torch.allclose(got, ref, atol=1e-4), f"natten: max diff {(got - ref).abs().max():.3e}"


def test_by_window_processor_routes_by_window_volume():
    """Small windows (stages 1-4) go to the first processor, stage 5's 11³ to the second; results stay exact."""
    calls = []

    class Spy(na.SdpaNAProcessor):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def na3d(self, q, k, v, kernel):
            calls.append((self.name, tuple(kernel)))
            return super().na3d(q, k, v, kernel)

    proc = na.ByWindowProcessor(Spy("small"), Spy("large"))
    assert proc.name == "small+large"
    for kernel in [(3, 7, 7), (3, 5, 5), (11, 11, 11)]:
        q, k, v = _qkv((1, 11, 11, 11, 1, 8))
        torch.testing.assert_close(proc.na3d(q, k, v, kernel), _dense_reference(q, k, v, kernel))
    assert calls == [("small", (3, 7, 7)), ("small", (3, 5, 5)), ("large", (11, 11, 11))]


@pytest.mark.parametrize("dim,head_dim", [(256, 64), (64, 16), (96, 48)])
def test_project_qkv_matches_the_diffusers_module(dim, head_dim):
    """Our Q/K/V projection (RoPE as one complex multiply per axis, the query's 1/√D folded into it) equals the
    module's own `project_qkv`: float32 to rounding, bfloat16 bit for bit but for rare 1-ulp ties. head_dim 48 has
    a scale that is not a power of two, where folding would round differently: the module's method is used."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttention
    torch.manual_seed(0)
    attn = LTX2VideoVaeNeighborhoodAttention(dim, (3, 3, 3), head_dim=head_dim)
    for p in attn.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(2, 5, 6, 7, dim)
    for ours, ref in zip(na.project_qkv(attn, x), attn.project_qkv(x)):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    attn, x = attn.to(torch.bfloat16), x.to(torch.bfloat16)
    for ours, ref in zip(na.project_qkv(attn, x), attn.project_qkv(x)):
        assert (ours != ref).float().mean() < 1e-3
        torch.testing.assert_close(ours, ref, rtol=2 ** -7, atol=0)
