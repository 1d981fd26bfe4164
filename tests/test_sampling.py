"""Distilled sampling (docs/MODEL.md §7, §13 items 10-11): step math, noise streams, sampler choice, the stage loop and
the sampler node. A fake denoiser stands in for the DiT except in the tiny end-to-end test."""
from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx.dit import sampling
from nodes.ltx.errors import LTX25Error
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent

VIDEO, AUDIO = (1, 128, 2, 2, 3), (1, 8, 9, 16)   # 9 frames at 24 fps


class Recorder:
    """A deterministic fake denoiser `(video, audio, sigma) → (x0_video, x0_audio)` that records its inputs."""

    def __init__(self):
        self.calls = []

    def __call__(self, video, audio, sigma):
        self.calls.append((video.clone(), audio.clone(), sigma))
        return 0.5 * torch.tanh(video) + 0.1 * sigma, 0.7 * torch.sin(audio) - 0.05


def zeros():
    return torch.zeros(VIDEO), torch.zeros(AUDIO)


# ---------------------------------------------------------------------------------------------------- step math
def test_distilled_schedules():
    """The shipped schedules (constants.py of the reference), with the trailing 0 diffusers leaves out."""
    assert sampling.DISTILLED_SIGMAS == (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0)
    assert sampling.STAGE2_SIGMAS == (0.909375, 0.725, 0.421875, 0.0)


def test_euler_step_matches_closed_form():
    """x + (x - x0)/σ·(σ_next - σ), computed in fp32 and returned in the latent dtype."""
    g = torch.Generator().manual_seed(1)
    x, x0 = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    got = sampling.euler_step(x, x0, 0.725, 0.421875)
    want = x.double() + (x.double() - x0.double()) / 0.725 * (0.421875 - 0.725)
    assert (got.double() - want).abs().max() < 1e-6, f"max diff {(got.double() - want).abs().max()}"
    assert sampling.euler_step(x.bfloat16(), x0.bfloat16(), 0.725, 0.4).dtype == torch.bfloat16


def test_ancestral_step_matches_closed_form():
    """σ_down = σ_next²/σ, the x' interpolation, the (1-σ_next)/(1-σ_down) rescale and the noise std, in fp64 here;
    any change to one of the four terms moves the result by far more than 1e-6."""
    g = torch.Generator().manual_seed(2)
    x, x0, noise = (torch.randn(3, 7, generator=g) for _ in range(3))
    sigma, sigma_next = 0.975, 0.909375
    s_down = sigma_next**2 / sigma
    x_prime = (s_down / sigma) * x.double() + (1 - s_down / sigma) * x0.double()
    std = math.sqrt(sigma_next**2 - s_down**2 * (1 - sigma_next) ** 2 / (1 - s_down) ** 2)
    want = (1 - sigma_next) / (1 - s_down) * x_prime + std * noise.double()
    got = sampling.ancestral_step(x, x0, sigma, sigma_next, noise)
    assert (got.double() - want).abs().max() < 1e-5, f"max diff {(got.double() - want).abs().max()}"
    assert std > 0.1  # the noise term is really exercised


def test_ancestral_step_returns_x0_at_final_sigma():
    """At σ_next = 0 the ancestral step returns x0 exactly (no noise, no division by 1 - σ_down)."""
    x, x0 = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(sampling.ancestral_step(x, x0, 0.421875, 0.0, None), x0)


# ---------------------------------------------------------------------------------------------------- schedules, choices
def test_parse_sigmas_accepts_and_refuses():
    """A custom list parses; non-decreasing, > 1 at the start, not ending at 0, or non-numeric entries are refused."""
    assert sampling.parse_sigmas("1.0, 0.5 0.0") == (1.0, 0.5, 0.0)
    assert sampling.parse_sigmas("  ") is None
    for bad, what in [("1.0, 0.5, 0.6, 0.0", "strictly decreasing"), ("1.2, 0.5, 0.0", "first sigma"),
                      ("1.0, 0.5", "last sigma"), ("1.0, x, 0.0", "a number"), ("0.0", "at least 2"),
                      ("1.0, 1.0, 0.0", "strictly decreasing")]:
        with pytest.raises(LTX25Error, match=what):
            sampling.parse_sigmas(bad, "LTX25DistilledSampler.sigmas")


def test_auto_sampler_follows_model_version():
    """auto: Euler-ancestral for stage 1 of 2.5 (and later), plain Euler for 2.3 and for every stage 2."""
    assert sampling.resolve_sampler("auto", 1, "2.5.0") == "euler_ancestral"
    assert sampling.resolve_sampler("auto", 1, "2.6.0-rc1") == "euler_ancestral"
    assert sampling.resolve_sampler("auto", 1, "2.3.0") == "euler"
    assert sampling.resolve_sampler("auto", 2, "2.5.0") == "euler"
    assert sampling.resolve_sampler("euler", 1, "2.5.0") == "euler"


def test_cfg_other_than_one_refused():
    """CFG ≠ 1 on a distilled checkpoint (by file name) is refused saying distilled models take no CFG."""
    sampling.check_cfg(1.0, "ltx-2.5-22b-distilled-transformer-bf16.safetensors")
    with pytest.raises(LTX25Error, match="distilled models take no CFG"):
        sampling.check_cfg(3.0, "ltx-2.5-22b-distilled-transformer-bf16.safetensors", "LTX25DistilledSampler.cfg")
    with pytest.raises(LTX25Error, match="no CFG"):
        sampling.check_cfg(3.0, "ltx-2.5-22b-dev-transformer-bf16.safetensors")


# ---------------------------------------------------------------------------------------------------- noise streams
def test_stage1_starts_from_main_generator_noise_video_then_audio():
    """Stage 1 feeds the DiT pure noise from Generator().manual_seed(seed): the video draw first, then the audio."""
    fake = Recorder()
    sampling.sample_stage(fake, *zeros(), sampling.DISTILLED_SIGMAS, "euler", 7, 1)
    g = torch.Generator().manual_seed(7)
    video_noise, audio_noise = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    assert torch.equal(fake.calls[0][0], video_noise) and torch.equal(fake.calls[0][1], audio_noise)
    assert [c[2] for c in fake.calls] == list(sampling.DISTILLED_SIGMAS[:-1])  # one forward per step


def test_ancestral_noise_from_seed_plus_10000_video_then_audio():
    """Replaying Generator(seed+10000) drawing video then audio each step reproduces the sampler bit for bit;
    another offset or the other draw order does not."""
    seed, sigmas = 3, sampling.DISTILLED_SIGMAS
    fake = Recorder()
    video, audio = sampling.sample_stage(fake, *zeros(), sigmas, "euler_ancestral", seed, 1)

    def replay(offset, audio_first=False):
        main = torch.Generator().manual_seed(seed)
        v, a = torch.randn(VIDEO, generator=main), torch.randn(AUDIO, generator=main)
        anc = torch.Generator().manual_seed(seed + offset)
        for s, s_next in zip(sigmas, sigmas[1:]):
            x0v, x0a = Recorder()(v, a, s)
            if s_next == 0:
                nv = na = None
            elif audio_first:
                na, nv = torch.randn(AUDIO, generator=anc), torch.randn(VIDEO, generator=anc)
            else:
                nv, na = torch.randn(VIDEO, generator=anc), torch.randn(AUDIO, generator=anc)
            v, a = sampling.ancestral_step(v, x0v, s, s_next, nv), sampling.ancestral_step(a, x0a, s, s_next, na)
        return v, a

    want_v, want_a = replay(10000)
    assert torch.equal(video, want_v) and torch.equal(audio, want_a), \
        f"max diff {(video - want_v).abs().max()} / {(audio - want_a).abs().max()}"
    for other in (replay(0), replay(10000, audio_first=True)):
        assert not torch.equal(video, other[0])


def test_stage2_renoises_video_and_audio():
    """Stage 2 sets BOTH latents to lerp(latent, noise, 0.909375), the noise continuing the main generator after
    stage 1's draws (half-size video, audio); skipping the audio re-noise (§13 item 10) fails here."""
    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    fake = Recorder()
    sampling.sample_stage(fake, video, audio, sampling.STAGE2_SIGMAS, "euler", 11, 2)
    main = torch.Generator().manual_seed(11)
    torch.randn((1, 128, 2, 1, 1), generator=main), torch.randn(AUDIO, generator=main)  # stage 1's draws
    noise_v, noise_a = torch.randn(VIDEO, generator=main), torch.randn(AUDIO, generator=main)
    first_v, first_a, first_sigma = fake.calls[0]
    assert first_sigma == 0.909375
    assert torch.allclose(first_v, torch.lerp(video, noise_v, 0.909375), atol=1e-6), \
        f"video diff {(first_v - torch.lerp(video, noise_v, 0.909375)).abs().max()}"
    assert torch.allclose(first_a, torch.lerp(audio, noise_a, 0.909375), atol=1e-6), \
        f"audio diff {(first_a - torch.lerp(audio, noise_a, 0.909375)).abs().max()}"


def test_stage2_is_deterministic_euler_with_auto():
    """Stage 2 under 'auto' runs plain Euler for a 2.5 model: the result equals the Euler replay."""
    g = torch.Generator().manual_seed(5)
    video, audio = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    model = FakeModel("2.5.0")
    got = sampling.sample_distilled(model, None, video, audio, fps=24.0, seed=1, stage=2, denoise=model.denoise)
    want = sampling.sample_stage(Recorder(), video, audio, sampling.STAGE2_SIGMAS, "euler", 1, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_auto_sampler_runs_ancestral_for_25_and_euler_for_23():
    """Through sample_distilled: a 2.5 model's stage 1 equals the ancestral run, a 2.3 model's the Euler run."""
    runs = {}
    for version in ("2.5.0", "2.3.0"):
        model = FakeModel(version)
        runs[version] = sampling.sample_distilled(model, None, *zeros(), fps=24.0, seed=4, stage=1,
                                                  denoise=model.denoise)
    for version, name in (("2.5.0", "euler_ancestral"), ("2.3.0", "euler")):
        want = sampling.sample_stage(Recorder(), *zeros(), sampling.DISTILLED_SIGMAS, name, 4, 1)
        assert torch.equal(runs[version][0], want[0]), f"{version}: not {name}"


def test_same_seed_identical_other_seed_different():
    """Same seed → bit-identical latents (both samplers); another seed → different latents."""
    for name in ("euler", "euler_ancestral"):
        a = sampling.sample_stage(Recorder(), *zeros(), sampling.DISTILLED_SIGMAS, name, 9, 1)
        b = sampling.sample_stage(Recorder(), *zeros(), sampling.DISTILLED_SIGMAS, name, 9, 1)
        c = sampling.sample_stage(Recorder(), *zeros(), sampling.DISTILLED_SIGMAS, name, 10, 1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])


def test_on_step_called_once_per_step_and_inference_mode():
    """on_step(done, total) once per step; the denoiser runs under inference mode even when the caller is not."""
    steps, modes = [], []

    def denoise(v, a, s):
        modes.append(torch.is_inference_mode_enabled())
        return v * 0, a * 0

    sampling.sample_stage(denoise, *zeros(), (1.0, 0.5, 0.0), "euler", 0, 1, lambda d, t: steps.append((d, t)))
    assert steps == [(1, 2), (2, 2)] and all(modes)


# ---------------------------------------------------------------------------------------------------- the node
class FakeModel(torch.nn.Module):
    """Stands in for LTX25Transformer: a parameter (device/dtype) and `model_version`."""

    def __init__(self, version="2.5.0"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.model_version = version
        self.calls = 0

    def denoise(self, model, video, audio, sigma, cond, fps):
        self.calls += 1
        return Recorder()(video, audio, sigma)


@pytest.fixture
def fake_loaded(monkeypatch):
    """A Loaded transformer handle with a distilled file name; `nodes.ltx.dit.transformer.denoise` is the fake's."""
    model = FakeModel()
    monkeypatch.setitem(sys.modules, "nodes.ltx.dit.transformer", types.SimpleNamespace(denoise=model.denoise))
    info = SimpleNamespace(name="ltx-2.5-22b-distilled-transformer-bf16.safetensors")
    return Loaded(model, bridge.make_patcher(model), info)


def node_inputs():
    return LTX25EmptyLatent().make(64, 64, 9, 24.0, 1, True)


def test_sampler_node_keeps_frame_rate_and_shapes(fake_loaded):
    """The node returns LATENTs of the input shapes with frame_rate kept and the audio marked 'audio'."""
    video, audio = node_inputs()
    out_v, out_a = LTX25DistilledSampler().sample(fake_loaded, None, video, audio, 1, "1", "auto", 1.0)
    assert out_v["samples"].shape == video["samples"].shape and out_v["frame_rate"] == 24.0
    assert out_a["samples"].shape == audio["samples"].shape and out_a["type"] == "audio"
    assert torch.isfinite(out_v["samples"]).all() and fake_loaded.module.calls == 8


def test_sampler_node_refuses_cfg(fake_loaded):
    """cfg 3 on a distilled checkpoint is refused before any forward."""
    with pytest.raises(LTX25Error, match="distilled models take no CFG"):
        LTX25DistilledSampler().sample(fake_loaded, None, *node_inputs(), 1, "1", "auto", 3.0)
    assert fake_loaded.module.calls == 0


def test_sampler_node_custom_sigmas(fake_loaded):
    """A custom schedule string sets the number of forwards; a bad one names the sigmas input."""
    LTX25DistilledSampler().sample(fake_loaded, None, *node_inputs(), 1, "1", "auto", 1.0, "1.0, 0.5, 0.0")
    assert fake_loaded.module.calls == 2
    with pytest.raises(LTX25Error) as info:
        LTX25DistilledSampler().sample(fake_loaded, None, *node_inputs(), 1, "1", "auto", 1.0, "0.5, 0.9, 0.0")
    assert info.value.where == "LTX25DistilledSampler.sigmas"


def test_sampler_node_interrupt_mid_run(fake_loaded, monkeypatch):
    """An interrupt requested at step 2 raises the bridge's InterruptError after exactly 2 forwards, and the
    working memory is still released."""
    real_callback, emptied = bridge.step_callback, []

    def callback(total, label="ltx25", **options):
        inner = real_callback(total, label, **options)

        def on_step(done, total_now, *x0):
            if done == 2:
                bridge.request_interrupt()
            inner(done, total_now, *x0)
        return on_step

    monkeypatch.setattr(bridge, "step_callback", callback)
    monkeypatch.setattr(bridge, "empty_cache", lambda: emptied.append(True))
    with pytest.raises(bridge.InterruptError):
        LTX25DistilledSampler().sample(fake_loaded, None, *node_inputs(), 1, "1", "auto", 1.0)
    assert fake_loaded.module.calls == 2 and emptied


def test_sampler_node_takes_its_frame_rate_input_for_a_latent_without_one(fake_loaded):
    """A video LATENT without frame_rate (core ComfyUI's empty LTXV latents) is sampled at the node's frame_rate
    input, which the outputs then carry; a rate that does not fit the audio latent's length is refused naming the
    audio input; a non-positive rate is refused naming the video input."""
    video, audio = node_inputs()
    bare = {"samples": video["samples"]}
    out_v, out_a = LTX25DistilledSampler().sample(fake_loaded, None, bare, audio, 1, "1", "auto", frame_rate=24.0)
    assert out_v["frame_rate"] == out_a["frame_rate"] == 24.0 and fake_loaded.module.calls == 8
    with pytest.raises(LTX25Error) as info:
        LTX25DistilledSampler().sample(fake_loaded, None, bare, audio, 1, "1", "auto", frame_rate=12.0)
    assert info.value.where == "LTX25DistilledSampler.audio_latent"
    with pytest.raises(LTX25Error, match="frame_rate"):
        LTX25DistilledSampler().sample(fake_loaded, None, bare, audio, 1, "1", "auto", frame_rate=0.0)


# ---------------------------------------------------------------------------------------------------- tiny models
def tiny_handle(tiny_file, component, load):
    from nodes.ltx.files.assets import inspect_asset
    path = tiny_file(component)
    return Loaded.register(load(path, torch.float32), inspect_asset(path))


def tiny_conditioning():
    from nodes.ltx.conditioning import Conditioning
    from nodes.tools.tiny.common import TINY_DIMS
    g = torch.Generator().manual_seed(0)
    return Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g))


def test_tiny_transformer_same_seed_identical(tiny_file):
    """With the tiny LTX-2.5 transformer (auto → ancestral stage 1): the same seed gives bit-identical latents,
    another seed different ones, all finite. Skipped only while the transformer module is missing."""
    transformer = pytest.importorskip("nodes.ltx.dit.transformer")
    model, cond = tiny_handle(tiny_file, "transformer", transformer.load_transformer), tiny_conditioning()

    def run(seed):
        video, audio = LTX25EmptyLatent().make(128, 64, 9, 24.0, 1, False)
        return LTX25DistilledSampler().sample(model, cond, video, audio, seed, "1", "auto", 1.0, "1.0, 0.7, 0.0")

    (v1, a1), (v2, a2), (v3, a3) = run(1), run(1), run(2)
    assert torch.isfinite(v1["samples"]).all() and torch.isfinite(a1["samples"]).all()
    assert torch.equal(v1["samples"], v2["samples"]) and torch.equal(a1["samples"], a2["samples"])
    assert not torch.equal(v1["samples"], v3["samples"]) and not torch.equal(a1["samples"], a3["samples"])


def test_tiny_two_stage_pipeline(tiny_file):
    """Stage 1 → upsample → stage 2 with the tiny transformer, upsampler and a video VAE's statistics: finite
    latents of the right shapes, frame_rate carried through."""
    from nodes.ltx.dit import transformer
    from nodes.ltx.decode.conv_vae import load_conv_vae as load_vae
    vae_module = "conv_vae"
    from nodes.ltx.upsampler import load_upsampler
    from nodes.comfy.sampling import LTX25LatentUpsample

    model = tiny_handle(tiny_file, "transformer", transformer.load_transformer)
    ups, vae = tiny_handle(tiny_file, "upsampler", load_upsampler), tiny_handle(tiny_file, vae_module, load_vae)
    cond = tiny_conditioning()
    video, audio = LTX25EmptyLatent().make(128, 64, 9, 24.0, 1, True)
    assert video["samples"].shape == (1, 128, 2, 1, 2)
    video, audio = LTX25DistilledSampler().sample(model, cond, video, audio, 1, "1", "auto", 1.0)
    (video,) = LTX25LatentUpsample().upsample(ups, vae, video)
    video, audio = LTX25DistilledSampler().sample(model, cond, video, audio, 1, "2", "auto", 1.0)
    assert video["samples"].shape == (1, 128, 2, 2, 4) and audio["samples"].shape == (1, 8, 9, 16)
    assert video["frame_rate"] == 24.0 and audio["type"] == "audio"
    assert torch.isfinite(video["samples"]).all() and torch.isfinite(audio["samples"]).all()
