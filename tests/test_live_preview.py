"""Live previews while sampling (issue 21 item 7), in the distilled and the guided (dev) sampler: the engine hands
each step's x0 video latent to an optional callback without changing what it samples, and the bridge turns it into
a preview image on ComfyUI's progress bar (faked here; the real previewer is exercised in the real-ComfyUI tier) and
ignores it headless."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.sampling import LTX25DistilledSampler, LTX25EmptyLatent
from nodes.ltx.dit import sampling

VIDEO, AUDIO = (1, 128, 2, 2, 3), (1, 8, 9, 16)


def fake_denoise(video, audio, sigma):
    return 0.5 * torch.tanh(video) + 0.1 * sigma, 0.7 * torch.sin(audio) - 0.05


def test_on_x0_gets_each_steps_x0_video_and_outputs_are_unchanged():
    """Every step calls on_x0(done, steps, x0) with exactly the denoiser's x0 video of that step, before on_step;
    the sampled latents are bit-identical to a run without the callback, for both steppers."""
    for name in ("euler", "euler_ancestral"):
        predictions, seen, order = [], [], []

        def denoise(video, audio, sigma):
            x0 = fake_denoise(video, audio, sigma)
            predictions.append(x0[0].clone())
            return x0

        def on_x0(done, steps, x0_video):
            seen.append((done, steps, x0_video.clone()))
            order.append("x0")

        zeros = torch.zeros(VIDEO), torch.zeros(AUDIO)
        got = sampling.sample_stage(denoise, *zeros, sampling.DISTILLED_SIGMAS, name, 4, 1,
                                    on_step=lambda d, t: order.append("step"), on_x0=on_x0)
        want = sampling.sample_stage(fake_denoise, *zeros, sampling.DISTILLED_SIGMAS, name, 4, 1)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert [(d, t) for d, t, _ in seen] == [(i, 8) for i in range(1, 9)]
        assert all(x0.shape == VIDEO and torch.equal(x0, p) for (_, _, x0), p in zip(seen, predictions))
        assert order == ["x0", "step"] * 8


def test_headless_step_callback_ignores_the_preview_latent(monkeypatch, capsys):
    """Without ComfyUI the preview callback only counts progress: an x0 is taken and ignored, the progress line
    still reaches 3/3, and a requested interrupt still stops it."""
    monkeypatch.setattr(bridge.progress, "HAS_COMFY", False)
    monkeypatch.setattr(bridge.interrupts, "HAS_COMFY", False)
    monkeypatch.delenv("LTX25_QUIET", raising=False)
    on_step = bridge.step_callback(3, "test", preview_latent=True)
    for done in (1, 2, 3):
        on_step(done, 3, torch.zeros(VIDEO))
    assert "[test] 3/3" in capsys.readouterr().err
    bridge.request_interrupt()
    with pytest.raises(bridge.InterruptError):
        on_step(1, 3, torch.zeros(VIDEO))


class FakeProgressBar:
    updates: list = []

    def __init__(self, total):
        self.total = total

    def update_absolute(self, value, total=None, preview=None):
        FakeProgressBar.updates.append((value, total, preview))


class FakePreviewer:
    def decode_latent_to_preview_image(self, preview_format, x0):
        return (preview_format, tuple(x0.shape), 512)


def test_step_callback_sends_previews_through_comfyui_progress_bar(monkeypatch):
    """Under ComfyUI (faked: progress bar, interrupt check, previewer) a preview callback sends each step's value
    and total with the image the previewer made from that step's x0; a step without x0 sends no image."""
    FakeProgressBar.updates = []
    monkeypatch.setattr(bridge.progress, "HAS_COMFY", True)
    monkeypatch.setattr(bridge.progress, "_comfy_utils", SimpleNamespace(ProgressBar=FakeProgressBar))
    monkeypatch.setattr(bridge.progress, "_ltx_video_previewer", lambda: FakePreviewer())
    monkeypatch.setattr(bridge.interrupts, "HAS_COMFY", True)
    monkeypatch.setattr(bridge.interrupts, "_mm",
                        SimpleNamespace(throw_exception_if_processing_interrupted=lambda: None))
    on_step = bridge.step_callback(3, "test", preview_latent=True)
    on_step(1, 3, torch.zeros(VIDEO))
    on_step(2, 3)
    on_step(3, 3, torch.zeros(VIDEO))
    assert FakeProgressBar.updates == [(1, 3, ("JPEG", VIDEO, 512)), (2, 3, None), (3, 3, ("JPEG", VIDEO, 512))]


@pytest.fixture
def step_calls(monkeypatch) -> list:
    """Each step callback the nodes ask the bridge for, recorded per step: (the options asked with, done, total, the
    x0 video's shape or None); the real callback still runs."""
    real_callback, calls = bridge.step_callback, []

    def spy(total, label="ltx25", **options):
        inner = real_callback(total, label, **options)

        def on_step(done, total_now, *x0):
            calls.append((options, done, total_now, tuple(x0[0].shape) if x0 else None))
            inner(done, total_now, *x0)
        return on_step

    monkeypatch.setattr(bridge, "step_callback", spy)
    return calls


def test_sampler_node_hands_each_steps_x0_to_a_preview_callback(monkeypatch, step_calls):
    """The sampler node asks the bridge for a preview callback and feeds it every step's x0 video latent of the
    sampled shape (8 steps at stage 1); its outputs equal a run whose callback takes no x0."""
    video, audio = LTX25EmptyLatent().make(64, 64, 9, 24.0, 1, True)
    model = SimpleNamespace(info=SimpleNamespace(name="ltx-2.5-distilled.safetensors"), module=torch.nn.Linear(1, 1),
                            ready=lambda memory: model.module)
    model.module.model_version = "2.5"

    def denoise(module, v, a, sigma, cond, fps):
        return fake_denoise(v, a, sigma)

    real_sample, calls = sampling.sample_distilled, step_calls
    monkeypatch.setattr(sampling, "sample_distilled", lambda *a, **k: real_sample(*a, **k, denoise=denoise))

    out = LTX25DistilledSampler().sample(model, None, video, audio, 2, "1", "auto")
    shape = tuple(video["samples"].shape)
    assert calls == [({"preview_latent": True}, i, 8, shape) for i in range(1, 9)]
    zeros_v, zeros_a = video["samples"], audio["samples"]
    want = sampling.sample_stage(lambda v, a, s: fake_denoise(v, a, s), zeros_v, zeros_a, sampling.DISTILLED_SIGMAS,
                                 "euler_ancestral", 2, 1)
    assert torch.equal(out[0]["samples"], want[0]) and torch.equal(out[1]["samples"], want[1])


# ---------------------------------------------------------------------------------------------------- guided sampler
def test_res2s_on_x0_gets_each_steps_latest_x0_and_outputs_are_unchanged():
    """res_2s reports after each step the x0 of its second (midpoint) denoiser call, then the final call's x0 as one
    more step (steps + 1 reports, as its progress total), each before on_step; latents equal a run without it."""
    from nodes.ltx.dit import res2s
    sigmas = (1.0, 0.6, 0.3, 0.0)
    predictions, seen, order = [], [], []

    def denoise(video, audio, sigma):
        x0 = fake_denoise(video, audio, sigma)
        predictions.append(x0[0].float().clone())
        return x0

    def on_x0(done, total, x0_video):
        seen.append((done, total, x0_video.clone()))
        order.append("x0")

    zeros = torch.zeros(VIDEO), torch.zeros(AUDIO)
    got = res2s.sample_res2s(denoise, *zeros, sigmas, 4, 1, on_step=lambda d, t: order.append("step"), on_x0=on_x0)
    want = res2s.sample_res2s(fake_denoise, *zeros, sigmas, 4, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert [(d, t) for d, t, _ in seen] == [(i, 4) for i in range(1, 5)]
    assert len(predictions) == 7  # per step σ, then the midpoint; then the final x0
    wanted = [*predictions[1:6:2], predictions[6]]
    assert all(torch.equal(x0, p) for (_, _, x0), p in zip(seen, wanted))
    assert order == ["x0", "step"] * 4


def transformer_stand_in() -> torch.nn.Module:
    """A module the guided sampler node takes for a transformer of 2 blocks (it checks the guider's STG blocks against
    `dit.transformer_blocks`); the steps come from a fake denoise."""
    module = torch.nn.Linear(1, 1)
    module.dit = torch.nn.Module()
    module.dit.transformer_blocks = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
    return module


@pytest.mark.parametrize("sampler, reports", [("euler", 3), ("res_2s", 4)])
def test_guided_sampler_node_hands_each_steps_x0_to_a_preview_callback(monkeypatch, step_calls, sampler, reports):
    """The guided sampler node asks the bridge for a preview callback and feeds it each step's guided x0 video of
    the sampled shape (res_2s: its final x0 too, matching its progress total); outputs equal the engine's own run."""
    from nodes.comfy.guidance import LTX25GuidedSampler
    from nodes.ltx.dit import dev_sampling
    from nodes.ltx.dit.guidance import Guidance
    video, audio = LTX25EmptyLatent().make(64, 64, 9, 24.0, 1, True)
    model = SimpleNamespace(info=SimpleNamespace(name="ltx-2.5-dev.safetensors"), module=transformer_stand_in(),
                            ready=lambda memory: model.module)
    real_sample, calls = dev_sampling.sample_guided, step_calls
    monkeypatch.setattr(dev_sampling, "sample_guided", lambda *a, **k: real_sample(*a, **k, denoise=fake_denoise))

    guider = Guidance(SimpleNamespace(video=torch.zeros(1, 4, 8)))
    out = LTX25GuidedSampler().sample(model, guider, video, audio, 2, 3, sampler, "4096 tokens", "1", "sequential",
                                      "auto")
    shape = tuple(video["samples"].shape)
    assert calls == [({"preview_latent": True}, i, reports, shape) for i in range(1, reports + 1)]
    want = real_sample(model.module, guider, video["samples"], audio["samples"], fps=24.0, seed=2,
                       sigmas=dev_sampling.dev_sigmas(3), sampler=sampler, denoise=fake_denoise)
    assert torch.equal(out[0]["samples"], want[0]) and torch.equal(out[1]["samples"], want[1])
