"""Noise layouts of the distilled and the guided (dev) samplers (docs/MODEL.md §7): 'comfy' draws each seed's
numbers in the latent's own shape (ComfyUI core's noise), 'reference' draws the same sequence on the patchified
tokens (ltx-pipelines' noise). A fake denoiser stands in for the DiT."""
from __future__ import annotations

import pytest
import torch

from nodes.ltx.dit import sampling
from nodes.ltx.errors import LTX25Error
from test_live_preview import transformer_stand_in

VIDEO, AUDIO = (1, 128, 2, 2, 3), (1, 8, 9, 16)


def fake_denoise(video, audio, sigma):
    return 0.5 * torch.tanh(video) + 0.1 * sigma, 0.7 * torch.sin(audio) - 0.05


def token_noise(generator: torch.Generator, video_shape=VIDEO, audio_shape=AUDIO):
    """By hand: video tokens [B, F·H·W, C] in (f, h, w) order, audio tokens [B, T, C·M] channel-major, laid back out
    as [B, C, F, H, W] and [B, C, T, M] with plain indexing."""
    b, c, f, h, w = video_shape
    tokens = torch.randn((b, f * h * w, c), generator=generator)
    video = torch.empty(video_shape)
    for n in range(f * h * w):
        video[:, :, n // (h * w), (n // w) % h, n % w] = tokens[:, n, :]
    b, ca, t, m = audio_shape
    tokens = torch.randn((b, t, ca * m), generator=generator)
    audio = torch.empty(audio_shape)
    for k in range(ca * m):
        audio[:, k // m, :, k % m] = tokens[:, :, k]
    return video, audio


def test_comfy_layout_is_the_default_and_draws_in_latent_shape():
    """'comfy' (and no choice at all) is one randn per modality in the latent's own shape: core ComfyUI's noise for
    the seed. Changing the default breaks every seed users already have."""
    zeros = torch.zeros(VIDEO), torch.zeros(AUDIO)
    g = torch.Generator().manual_seed(5)
    want = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    for got in (sampling.initial_noise(*zeros, 5, 1), sampling.initial_noise(*zeros, 5, 1, "comfy")):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_reference_layout_is_the_same_sequence_on_tokens():
    """'reference' equals the same generator drawn as video tokens then audio tokens, unpatchified by hand; it
    differs from 'comfy' for the same seed (same values, other places)."""
    zeros = torch.zeros(VIDEO), torch.zeros(AUDIO)
    got_v, got_a = sampling.initial_noise(*zeros, 5, 1, "reference")
    want_v, want_a = token_noise(torch.Generator().manual_seed(5))
    assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)
    comfy_v, comfy_a = sampling.initial_noise(*zeros, 5, 1, "comfy")
    assert not torch.equal(got_v, comfy_v) and not torch.equal(got_a, comfy_a)
    assert torch.equal(got_v.flatten().sort().values, comfy_v.flatten().sort().values)


def test_reference_layout_stage2_skips_stage1_draws():
    """Stage 2 in the reference layout skips the half-size video and the audio that stage 1 drew, then draws its
    own tokens: a stage 2 that re-read stage 1's noise would match the first draws instead."""
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    got_v, got_a = sampling.initial_noise(video, audio, 8, 2, "reference")
    g = torch.Generator().manual_seed(8)
    token_noise(g, (1, 128, 2, 1, 1), AUDIO)
    want_v, want_a = token_noise(g)
    assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)


def test_stage2_skips_what_stage1_said_it_drew():
    """A stage 1 holding tokens stage 2 does not (an IC-LoRA's reference) drew more than stage 2's latent at half
    size: with `skip` (the counts stage 1 handed on) stage 2 continues the one generator where stage 1 left it, as
    the reference's pipeline does; the half-size count would start it elsewhere."""
    video, audio = torch.zeros(VIDEO), torch.zeros(AUDIO)
    reference_tokens = 7 * 128  # stage 1's video: its half-size latent and 7 appended tokens, as one token row
    drawn = (128 * 2 * 1 * 1 + reference_tokens, AUDIO[1] * AUDIO[2] * AUDIO[3])
    got_v, got_a = sampling.initial_noise(video, audio, 8, 2, "reference", skip=drawn)
    g = torch.Generator().manual_seed(8)
    torch.randn((1, 2 * 1 * 1 + 7, 128), generator=g), torch.randn((1, AUDIO[2], 128), generator=g)
    want_v, want_a = token_noise(g)
    assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)
    assert not torch.equal(sampling.initial_noise(video, audio, 8, 2, "reference")[0], want_v)


def test_reference_layout_ancestral_noise_is_on_tokens_too():
    """The whole Euler-ancestral run in the reference layout equals a replay whose main and ancestral draws are all
    token-layout; replaying with latent-layout step noise does not match."""
    seed, sigmas = 3, sampling.DISTILLED_SIGMAS
    video, audio = sampling.sample_stage(fake_denoise, torch.zeros(VIDEO), torch.zeros(AUDIO), sigmas,
                                         "euler_ancestral", seed, 1, noise_layout="reference")

    def replay(step_tokens: bool):
        v, a = token_noise(torch.Generator().manual_seed(seed))
        anc = torch.Generator().manual_seed(seed + sampling.ANCESTRAL_SEED_OFFSET)
        for s, s_next in zip(sigmas, sigmas[1:]):
            x0v, x0a = fake_denoise(v, a, s)
            if s_next == 0:
                nv = na = None
            elif step_tokens:
                nv, na = token_noise(anc)
            else:
                nv, na = torch.randn(VIDEO, generator=anc), torch.randn(AUDIO, generator=anc)
            v, a = sampling.ancestral_step(v, x0v, s, s_next, nv), sampling.ancestral_step(a, x0a, s, s_next, na)
        return v, a

    want_v, want_a = replay(True)
    assert torch.equal(video, want_v) and torch.equal(audio, want_a), \
        f"max diff {(video - want_v).abs().max()} / {(audio - want_a).abs().max()}"
    assert not torch.equal(video, replay(False)[0])


def test_unknown_noise_layout_refused():
    """A layout other than comfy/reference is an error naming the input, not a silent fallback."""
    with pytest.raises(LTX25Error) as info:
        sampling.sample_stage(fake_denoise, torch.zeros(VIDEO), torch.zeros(AUDIO), (1.0, 0.0), "euler", 0, 1,
                              noise_layout="tokens")
    assert info.value.where == "noise_layout"



def test_sampler_node_offers_noise_layout_default_comfy(monkeypatch):
    """The sampler node lists the layouts as an optional input defaulting to 'comfy' and passes the choice to the
    engine; an unknown one is refused naming the node's input before the model is made ready."""
    from types import SimpleNamespace
    from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent
    spec = LTX25DistilledSampler.INPUT_TYPES()["optional"]["noise_layout"]
    assert spec[0] == list(sampling.NOISE_LAYOUTS) and spec[1]["default"] == "comfy"
    readied, seen = [], []
    model = SimpleNamespace(info=SimpleNamespace(name="ltx-2.5-distilled.safetensors"), module=torch.nn.Linear(1, 1),
                            ready=lambda memory: readied.append(memory) or model.module)
    monkeypatch.setattr(sampling, "sample_distilled",
                        lambda module, cond, video, audio, **k: seen.append(k["noise_layout"]) or (video, audio))
    video, audio = LTX25EmptyLatent().make(64, 64, 9, 24.0, 1, True)
    LTX25DistilledSampler().sample(model, None, video, audio, 0, "1", "auto")
    LTX25DistilledSampler().sample(model, None, video, audio, 0, "1", "auto", noise_layout="reference")
    assert seen == ["comfy", "reference"] and len(readied) == 2
    with pytest.raises(LTX25Error) as info:
        LTX25DistilledSampler().sample(model, None, video, audio, 0, "1", "auto", noise_layout="tokens")
    assert info.value.where == "LTX25DistilledSampler.noise_layout" and len(readied) == 2


# ---------------------------------------------------------------------------------------------------- guided sampler
def test_guided_sampler_node_offers_noise_layout_default_comfy(monkeypatch):
    """The guided (dev) sampler node has the same optional noise_layout (default 'comfy') and passes it to the
    engine; an unknown one is refused naming the node's input before the model is made ready."""
    from types import SimpleNamespace
    from nodes.comfy.guidance import LTX25GuidedSampler
    from nodes.comfy.sampling import LTX25EmptyLatent
    from nodes.ltx.dit import dev_sampling
    from nodes.ltx.dit.guidance import Guidance
    spec = LTX25GuidedSampler.INPUT_TYPES()["optional"]["noise_layout"]
    assert spec[0] == list(sampling.NOISE_LAYOUTS) and spec[1]["default"] == "comfy"
    readied, seen = [], []
    model = SimpleNamespace(info=SimpleNamespace(name="ltx-2.5-dev.safetensors"), module=transformer_stand_in(),
                            ready=lambda memory: readied.append(memory) or model.module)
    monkeypatch.setattr(dev_sampling, "sample_guided",
                        lambda module, guider, video, audio, **k: seen.append(k["noise_layout"]) or (video, audio))
    video, audio = LTX25EmptyLatent().make(64, 64, 9, 24.0, 1, True)
    guider = Guidance(SimpleNamespace(video=torch.zeros(1, 4, 8)))
    args = (model, guider, video, audio, 0, 3, "euler", "4096 tokens", "1", "sequential", "auto")
    LTX25GuidedSampler().sample(*args)
    LTX25GuidedSampler().sample(*args, noise_layout="reference")
    assert seen == ["comfy", "reference"] and len(readied) == 2
    with pytest.raises(LTX25Error) as info:
        LTX25GuidedSampler().sample(*args, noise_layout="tokens")
    assert info.value.where == "LTX25GuidedSampler.noise_layout" and len(readied) == 2


@pytest.mark.parametrize("sampler", ["euler", "euler_ancestral", "res_2s"])
def test_guided_stage_starts_from_the_layouts_noise(sampler):
    """Each guided stepper's first denoiser call (σ = 1 on zero latents) sees exactly the layout's initial noise,
    so a seed gives the reference's noise in 'reference' and core's in 'comfy'."""
    from nodes.ltx.dit import dev_sampling
    for layout in sampling.NOISE_LAYOUTS:
        first = []

        def denoise(video, audio, sigma):
            if not first:
                first.append((video.clone(), audio.clone()))
            return fake_denoise(video, audio, sigma)

        dev_sampling.sample_guided(torch.nn.Linear(1, 1), None, torch.zeros(VIDEO), torch.zeros(AUDIO), fps=24.0,
                                   seed=6, sigmas=(1.0, 0.5, 0.0), sampler=sampler, denoise=denoise,
                                   noise_layout=layout)
        want = sampling.initial_noise(torch.zeros(VIDEO), torch.zeros(AUDIO), 6, 1, layout)
        assert torch.equal(first[0][0], want[0]) and torch.equal(first[0][1], want[1]), (sampler, layout)


def test_res2s_step_noise_is_drawn_on_tokens_in_the_reference_layout():
    """res_2s's SDE noise in the reference layout is a token-shaped float64 draw, standardized over the tensor and
    then per clip, laid out as the latent (the reference's loop draws on its patchified state); 'comfy' draws in
    the latent's shape, so the two differ for one generator state."""
    from nodes.ltx.dit import res2s
    like = torch.zeros(2, *VIDEO[1:])
    got = res2s.step_noise(like, torch.Generator().manual_seed(9), "reference")
    b, c, f, h, w = like.shape
    tokens = torch.randn((b, f * h * w, c), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    tokens = (tokens - tokens.mean()) / tokens.std()
    tokens = (tokens - tokens.mean(dim=(1, 2), keepdim=True)) / tokens.std(dim=(1, 2), keepdim=True)
    want = torch.empty(like.shape, dtype=torch.float64)
    for n in range(f * h * w):
        want[:, :, n // (h * w), (n // w) % h, n % w] = tokens[:, n, :]
    assert torch.equal(got, want)
    assert not torch.equal(got, res2s.step_noise(like, torch.Generator().manual_seed(9), "comfy"))
