"""Sizes that cannot fit are refused up front (issue 20, item 5): 8192×8192×1025 is within the widgets' limits, but
its latents, the transformer's or upsampler's working memory, or its decoded frames exceed any machine's memory.
Each node refuses before it allocates or loads anything, naming itself, the bytes needed and the bytes available,
and what to change. The machine's memory is set by the test (`bridge.devices.memory_limit`), so the figures do not
depend on where the suite runs; the huge latents are zero-stride views that take no memory."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.memory_fit import host_available_bytes

GIB = 2**30
HUGE = (1, 128, 129, 256, 256)  # the video latent of 8192×8192×1025 at full size


def _limited(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(bridge.devices, "memory_limit", lambda device=None: int(gib * GIB))
    monkeypatch.setattr(Loaded, "ready", lambda *a: pytest.fail("a model was loaded before the refusal"))


def _view(shape) -> torch.Tensor:
    return torch.zeros(1).expand(shape)


def _figures(error: LTX25Error) -> tuple[float, float]:
    """(needed, available) GiB as the message states them."""
    numbers = re.findall(r"([\d,.]+) GiB", str(error))
    return float(numbers[0].replace(",", "")), float(numbers[1].replace(",", ""))


def test_host_memory_available_is_read_from_the_machine():
    """The CPU's limit is what the kernel says a new allocation can get: positive, and not above the RAM."""
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < host_available_bytes() <= total
    assert abs(bridge.memory_limit(torch.device("cpu")) - host_available_bytes()) < GIB  # read again: it moves


def test_empty_latent_refuses_latents_larger_than_host_memory(monkeypatch):
    """8192×8192×1025, batch 64, one stage: 258 GiB of latents (a bare allocator error before); the shipped size
    fits the same limit."""
    from nodes.comfy.sampling import LTX25EmptyLatent
    _limited(monkeypatch, 8)
    with pytest.raises(LTX25Error, match="^LTX25EmptyLatent: the memory of its video and audio latents is "
                                         r"258\.0 GiB, expected at most the 8\.0 GiB of host memory") as error:
        LTX25EmptyLatent().make(8192, 8192, 1025, 24.0, 64, False)
    assert "Lower width, height, frames or batch" in str(error.value)
    video, _audio = LTX25EmptyLatent().make(768, 512, 121, 24.0, 1, True)
    assert video["samples"].shape == (1, 128, 16, 8, 12)


def test_the_samplers_refuse_a_latent_whose_working_memory_cannot_fit(tiny_models, monkeypatch):
    """The distilled and the guided sampler compare the transformer's `working_memory` for the latent with the
    device's memory before loading the model (the sampler ground for minutes before): the message names the node
    and both figures, and the needed figure is the estimate itself."""
    from nodes.comfy.guidance import LTX25GuidedSampler
    from nodes.comfy.loaders import LTX25TransformerLoader
    from nodes.comfy.sampling import LTX25DistilledSampler
    from nodes.ltx.dit import sampling
    from nodes.ltx.dit.guidance import Guidance
    from nodes.tools.tiny import OFFICIAL_FILES
    (model,) = LTX25TransformerLoader().load(OFFICIAL_FILES["transformer"][1], "as stored")
    _limited(monkeypatch, 1)
    video = {"samples": _view(HUGE), "frame_rate": 24.0}
    audio = {"samples": _view((1, 8, 1068, 16)), "frame_rate": 24.0}
    needed = sampling.working_memory(model.module, HUGE, audio["samples"].shape)
    prompts = SimpleNamespace(video=torch.zeros(1))
    with pytest.raises(LTX25Error, match="^LTX25DistilledSampler: the transformer's working memory") as error:
        LTX25DistilledSampler().sample(model, prompts, video, audio, 0, "1", "auto")
    assert _figures(error.value) == (round(needed / GIB, 1), 1.0), str(error.value)
    guider = Guidance(positive=prompts)
    with pytest.raises(LTX25Error, match="^LTX25GuidedSampler: the transformer's working memory"):
        LTX25GuidedSampler().sample(model, guider, video, audio, 0, 3, "euler", "latent", "1", "sequential", "auto")


def test_the_upsampler_and_both_decoders_refuse_what_cannot_fit(tiny_file, monkeypatch):
    """Latent Upsample checks its working memory; the decoders check the decoded frames, float32 on the host, which
    tiling does not make smaller (8192×8192×1025: 768 GiB) — before any weight is loaded."""
    from nodes.comfy.decode_conv import LTX25ConvVAEDecode
    from nodes.comfy.decode_diffusion import LTX25DiffusionVAEDecode
    from nodes.comfy.sampling import LTX25LatentUpsample
    from nodes.ltx import upsampler as ups
    from nodes.ltx.decode.conv_vae import load_conv_vae
    from nodes.ltx.decode.diffusion_vae import load_diffusion_vae

    def loaded(component, load):
        return Loaded(load(tiny_file(component), torch.float32), None, inspect_asset(tiny_file(component)))
    conv, diffusion = loaded("conv_vae", load_conv_vae), loaded("diffusion_vae", load_diffusion_vae)
    _limited(monkeypatch, 16)
    half = (1, 128, 129, 128, 128)
    with pytest.raises(LTX25Error, match="^LTX25LatentUpsample: the upsampler's working memory"):
        LTX25LatentUpsample().upsample(loaded("upsampler", ups.load_upsampler), conv, {"samples": _view(half)})
    tiling = ("auto", 80, 512, 40, 160, 0.0)
    for node, args in ((LTX25ConvVAEDecode(), (conv, {"samples": _view(HUGE)}, *tiling)),
                       (LTX25DiffusionVAEDecode(), (diffusion, {"samples": _view(HUGE)}, "sdpa", 0, 0, *tiling))):
        with pytest.raises(LTX25Error, match="the memory of the decoded frames is 768.8 GiB, expected at most the "
                                             "16.0 GiB") as error:
            node.decode(*args)
        assert str(error.value).startswith(type(node).__name__), error.value
