"""Guided sampling with the dev transformer (nodes/ltx/dit/dev_sampling.py, res2s.py, nodes/comfy/guidance.py):
the reference's dev schedule by hand, res_2s's tableau, re-noising and call pattern, res_2s without noise
integrating a Gaussian flow, and the guider/sampler nodes (neutral guidance = the distilled sampler bit for bit)."""
from __future__ import annotations

import math

import pytest
import torch

from nodes.comfy.guidance import LTX25GuidedSampler, LTX25MultimodalGuider
from nodes.comfy.handles import Loaded
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent
from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import dev_sampling, res2s, sampling
from nodes.ltx.dit.dev_sampling import dev_sigmas
from nodes.ltx.dit.transformer import load_transformer
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from nodes.tools.tiny.common import TINY_DIMS


# ---------------------------------------------------------------------------------------------------- schedule
def _by_hand(steps: int, tokens: int) -> list[float]:
    """The reference's LTX2Scheduler in float64 from its definition: shift e^μ/(e^μ + 1/s − 1), then the stretch
    that puts the last non-zero sigma at 0.1."""
    mu = tokens * (2.05 - 0.95) / 3072 + 0.95 - 1024 * (2.05 - 0.95) / 3072
    shifted = [math.exp(mu) / (math.exp(mu) + 1 / s - 1) for s in (1 - i / steps for i in range(steps))]
    scale = (1 - shifted[-1]) / (1 - 0.1)
    return [1 - (1 - s) / scale for s in shifted] + [0.0]


@pytest.mark.parametrize("steps, tokens", [(30, 4096), (15, 1536), (4, 1024)])
def test_dev_schedule_is_the_reference_formula(steps, tokens):
    """30 steps shifted for 4096 tokens (the two-stage pipeline), 15 for a stage-1 latent's tokens (the HQ
    pipeline): float32 values of the formula, from 1 down to the terminal 0.1, then 0."""
    got = dev_sigmas(steps, tokens)
    want = _by_hand(steps, tokens)
    assert len(got) == steps + 1 and got[-1] == 0.0
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6, list(zip(got, want))
    assert abs(got[-2] - 0.1) < 1e-6 and abs(got[0] - 1.0) < 1e-6
    assert sampling.check_sigmas(got) == got  # strictly decreasing, in (0, 1], ends at 0
    assert dev_sampling.latent_tokens((1, 128, 16, 8, 12)) == 1536


# ---------------------------------------------------------------------------------------------------- res_2s
def test_res2s_tableau_by_hand():
    """a21 = ½φ1(−h/2), b2 = 2φ2(−h), b1 = φ1(−h) − b2 with φ1(z) = (e^z − 1)/z, φ2(z) = (e^z − 1 − z)/z²; at h→0
    the step is the midpoint rule (a21 ½, b1 0, b2 1)."""
    h = math.log(2)
    a21, b1, b2 = res2s.coefficients(h)
    assert a21 == pytest.approx(0.5 * (math.exp(-h / 2) - 1) / (-h / 2), rel=1e-12)
    assert b2 == pytest.approx(2 * (0.5 - 1 + h) / h**2, rel=1e-12)
    assert b1 == pytest.approx((0.5 - 1) / -h - b2, rel=1e-12)
    assert res2s.coefficients(0.0) == pytest.approx((0.5, 0.0, 1.0))


def test_renoise_by_hand():
    """x = 1, deterministic result 0.5 from σ 0.8 to 0.4, eta ½, noise 0.3: slope 1.25, x0 0, σ_up 0.2,
    r = √0.12, α = 0.6 + r → α·(r/α)·1.25 + 0.2·0.3; eta 0 returns the deterministic result."""
    one = torch.ones(1, dtype=torch.float64)
    got = res2s.renoise(one, 0.5 * one, 0.8, 0.4, 0.3 * one, eta=0.5)
    assert got.item() == pytest.approx(math.sqrt(0.12) * 1.25 + 0.06, rel=1e-12)
    assert res2s.renoise(one, 0.5 * one, 0.8, 0.4, 0.3 * one, eta=0.0).item() == 0.5


def test_res2s_calls_the_denoiser_at_each_sigma_its_midpoint_and_the_final_0011():
    """Two calls per step (σ, then √(σ·σ_next)) and the final x0 at 0.0011 in place of the step to 0; latents keep
    their dtype; progress is reported per step and for the final call."""
    calls, steps_seen = [], []

    def denoise(v, a, sigma):
        calls.append(round(sigma, 9))
        return 0.5 * v.float(), 0.5 * a.float()
    video, audio = torch.zeros(1, 128, 2, 2, 2), torch.zeros(1, 8, 5, 16)
    out = res2s.sample_res2s(denoise, video, audio, (1.0, 0.5, 0.0), seed=1, stage=1,
                             on_step=lambda done, total: steps_seen.append((done, total)))
    assert calls == [1.0, round(math.sqrt(0.5), 9), 0.5, round(math.sqrt(0.5 * 0.0011), 9), 0.0011]
    assert steps_seen == [(1, 3), (2, 3), (3, 3)] and out[0].dtype == torch.float32
    with pytest.raises(LTX25Error, match="0.0011"):
        res2s.sample_res2s(denoise, video, audio, (1.0, 0.001, 0.0), seed=1, stage=1)


def _gaussian_denoiser(spread: float):
    """The exact x0 for data N(0, spread²) under x_σ = (1−σ)x0 + σ·noise."""
    def denoise(v, a, sigma):
        f = (1 - sigma) * spread**2 / ((1 - sigma) ** 2 * spread**2 + sigma**2)
        return (f * v.double()).float(), (f * a.double()).float()
    return denoise


def test_res2s_without_noise_integrates_the_gaussian_flow():
    """With the exact denoiser of Gaussian data N(0, 0.5²) the flow is linear: the deterministic res_2s (eta 0)
    maps the starting noise to 0.5 × itself after 100 steps, and with 15 steps comes closer to 0.5 than Euler: a
    sign or coefficient error shows as a wrong factor."""
    denoise, spread = _gaussian_denoiser(0.5), 0.5
    video, audio = torch.zeros(1, 128, 2, 4, 4), torch.zeros(1, 8, 5, 16)
    noise = sampling.initial_noise(video, audio, 0, 1)

    def factor(latents) -> list[float]:  # the least-squares k of latents ≈ k · noise, per stream
        return [((x * n).sum() / (n * n).sum()).item() for x, n in zip(latents, noise)]
    fine = tuple(torch.linspace(1, 0, 101).tolist())
    for k in factor(res2s.sample_res2s(denoise, video, audio, fine, 0, 1, eta=0.0, substep_eta=0.0)):
        assert abs(k - spread) < 2e-3, k
    coarse = tuple(torch.linspace(1, 0, 16).tolist())
    rk = factor(res2s.sample_res2s(denoise, video, audio, coarse, 0, 1, eta=0.0, substep_eta=0.0))[0]
    euler = factor(sampling.sample_stage(denoise, video, audio, coarse, "euler", 0, 1))[0]
    assert abs(rk - spread) < abs(euler - spread), (rk, euler)


def test_res2s_noise_follows_the_seed():
    """The SDE noise comes from the seed's generators: same seed, same latents; another seed, others."""
    denoise = _gaussian_denoiser(0.5)
    video, audio = torch.zeros(1, 128, 2, 2, 2), torch.zeros(1, 8, 5, 16)
    sigmas = dev_sigmas(3)
    a, b, c = (res2s.sample_res2s(denoise, video, audio, sigmas, seed, 1)[0] for seed in (4, 4, 5))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------------------------------------------- nodes
def _conditioning(seed: int) -> Conditioning:
    g = torch.Generator().manual_seed(seed)
    return Conditioning(torch.randn(1, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(1, 1024, TINY_DIMS["audio_inner"], generator=g))


def _guider(**scales):
    neutral = dict(video_cfg=1.0, audio_cfg=1.0, video_stg=0.0, audio_stg=0.0, video_stg_blocks="1",
                   audio_stg_blocks="1", a2v_scale=1.0, v2a_scale=1.0, video_rescale=0.0, audio_rescale=0.0)
    return LTX25MultimodalGuider().guide(_conditioning(1), **{**neutral, **scales},
                                         negative=_conditioning(2))[0]


@pytest.fixture(scope="module")
def handle(transformer_path):
    return Loaded.register(load_transformer(transformer_path, torch.float32), inspect_asset(transformer_path))


def _latents():
    return LTX25EmptyLatent().make(128, 128, 9, 24.0, 1, True)


def test_neutral_guided_sampler_is_the_distilled_sampler_bit_for_bit(handle):
    """A guider with every scale neutral, Euler on the same custom sigmas: the guided sampler's latents equal the
    distilled sampler's bit for bit (one unguided forward per step, the same noise)."""
    video, audio = _latents()
    sigmas = "1.0, 0.8, 0.4, 0.0"
    guided = LTX25GuidedSampler().sample(handle, _guider(), video, audio, 7, 3, "euler", "4096 tokens", "1",
                                         "sequential", "auto", sigmas=sigmas)
    distilled = LTX25DistilledSampler().sample(handle, _conditioning(1), video, audio, 7, "1", "euler",
                                               sigmas=sigmas)
    assert all(torch.equal(g["samples"], d["samples"]) for g, d in zip(guided, distilled))


@pytest.mark.parametrize("sampler", ["euler", "res_2s"])
def test_guided_sampler_runs_the_dev_schedule_with_full_guidance(handle, sampler):
    """The reference's guidance (cfg, STG on block 1, modality, rescale) with the dev schedule: latents of the
    input shapes with their frame rate, finite, and different from the unguided run's."""
    video, audio = _latents()
    args = (video, audio, 3, 2, sampler, "latent tokens", "1", "batched", "auto")
    guided = LTX25GuidedSampler().sample(handle, _guider(video_cfg=3.0, audio_cfg=7.0, video_stg=1.0, audio_stg=1.0,
                                                         a2v_scale=3.0, v2a_scale=3.0, video_rescale=0.7,
                                                         audio_rescale=0.7), *args)
    plain = LTX25GuidedSampler().sample(handle, _guider(), *args)
    for got, want, latent in zip(guided, plain, (video, audio)):
        assert got["samples"].shape == latent["samples"].shape and got["frame_rate"] == 24.0
        assert torch.isfinite(got["samples"]).all() and not torch.equal(got["samples"], want["samples"])


def test_guider_refuses_stg_without_blocks_and_cfg_without_negative():
    """STG with an empty block list would equal the prompt pass (a wasted forward): refused, naming the input; a
    cfg ≠ 1 with no negative conditioning is refused at the guider."""
    with pytest.raises(LTX25Error, match="video_stg_blocks"):
        _guider(video_stg=1.0, video_stg_blocks=" ")
    with pytest.raises(LTX25Error, match="negative"):
        LTX25MultimodalGuider().guide(_conditioning(1), 3.0, 1.0, 0.0, 0.0, "28", "28", 1.0, 1.0, 0.0, 0.0)


def test_guided_sampler_refuses_a_prompt_count_that_fits_no_batch(handle):
    video, audio = LTX25EmptyLatent().make(128, 128, 9, 24.0, 2, True)
    three = Conditioning(torch.zeros(3, 1024, TINY_DIMS["video_inner"]), torch.zeros(3, 1024, TINY_DIMS["audio_inner"]))
    guider = LTX25MultimodalGuider().guide(three, 1.0, 1.0, 0.0, 0.0, "1", "1", 1.0, 1.0, 0.0, 0.0)[0]
    with pytest.raises(LTX25Error, match="number of prompts"):
        LTX25GuidedSampler().sample(handle, guider, video, audio, 0, 2, "euler", "4096 tokens", "1", "sequential",
                                    "auto")


@pytest.mark.parametrize("acceleration", ["cuda_graph", "compile_cuda_graph"])
def test_guided_sampler_refuses_an_acceleration_it_cannot_run_by_its_field_before_loading(handle, acceleration):
    """On the CPU no graph mode runs, and guided sampling offers no compile: refused naming the node's input
    before the transformer is placed."""
    from nodes.comfy import bridge
    bridge.unload_model(handle.patcher)
    video, audio = LTX25EmptyLatent().make(128, 128, 9, 24.0, 1, True)
    with pytest.raises(LTX25Error) as error:
        LTX25GuidedSampler().sample(handle, _guider(), video, audio, 0, 2, "euler", "4096 tokens", "1", "sequential",
                                    acceleration)
    assert error.value.where == "LTX25GuidedSampler.acceleration", str(error.value)
    assert not handle.patcher.is_loaded(), "refused after placing the transformer"


@pytest.mark.parametrize("node", ["LTX25DistilledSampler", "LTX25GuidedSampler"])
def test_stage_2_refuses_the_half_size_latent_latent_upsample_did_not_double(handle, node):
    """Empty Latent's two_stage latent wired past Latent Upsample into stage 2 would refine a half-size clip: refused
    by the node's input before the transformer is placed. Stage 1 takes it; stage 2 takes a full-size one."""
    from nodes.comfy import bridge
    bridge.unload_model(handle.patcher)
    (video, audio), (full, _) = _latents(), LTX25EmptyLatent().make(128, 128, 9, 24.0, 1, False)

    def sample(latent, stage):
        if node == "LTX25DistilledSampler":
            return LTX25DistilledSampler().sample(handle, _conditioning(1), latent, audio, 0, stage, "euler",
                                                  sigmas="0.4, 0.0")
        return LTX25GuidedSampler().sample(handle, _guider(), latent, audio, 0, 1, "euler", "4096 tokens", stage,
                                           "sequential", "auto", sigmas="0.4, 0.0")
    with pytest.raises(LTX25Error) as error:
        sample(video, "2")
    assert error.value.where == f"{node}.video_latent" and "Latent Upsample" in str(error.value), str(error.value)
    assert not handle.patcher.is_loaded(), "refused after placing the transformer"
    sample(video, "1")
    sample(full, "2")


def test_guided_sampler_refuses_stg_blocks_outside_the_model_by_the_guiders_input_before_loading(handle):
    """The guider cannot know the model: the sampler checks its STG blocks against the connected transformer (2
    blocks here) before placing it, naming the guider node's input and the model's real block count."""
    from nodes.comfy import bridge
    bridge.unload_model(handle.patcher)
    video, audio = _latents()
    with pytest.raises(LTX25Error) as error:
        LTX25GuidedSampler().sample(handle, _guider(video_stg=1.0, video_stg_blocks="99"), video, audio, 0, 1,
                                    "euler", "4096 tokens", "1", "sequential", "auto", sigmas="0.4, 0.0")
    assert error.value.where == "LTX25MultimodalGuider.video_stg_blocks", str(error.value)
    assert "0 … 1" in str(error.value) and "has 2 blocks" in str(error.value), str(error.value)
    assert not handle.patcher.is_loaded(), "refused after placing the transformer"
