"""The latent upsampler (docs/MODEL.md §8, §12): config from the flat metadata with the native→diffusers renames, strict
loading, the resampler-keys consistency check, and the un-normalize → upsample → normalize wrapping."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nodes.comfy.handles import Loaded
from nodes.ltx import upsampler as ups
from nodes.ltx.errors import LTX25Error
from nodes.tools.tiny.common import latent_statistics
from nodes.tools.tiny.upsampler import TINY_CONFIG
from nodes.comfy.sampling import LTX25LatentUpsample


@pytest.fixture(scope="module")
def tiny_upsampler(tiny_file):
    return ups.load_upsampler(tiny_file("upsampler"), torch.float32)


def test_tiny_file_is_native_format(tiny_file):
    """The tiny file carries the flat native `config` (`_class_name: LatentUpsampler`, native field names) and
    the non-rational `upsampler.0.*` keys of the shipped 2.5 x2 file."""
    with safe_open(tiny_file("upsampler"), "pt") as f:
        config, keys = json.loads(f.metadata()["config"]), set(f.keys())
    assert config["_class_name"] == "LatentUpsampler" and config["rational_resampler"] is False
    assert "spatial_scale" in config and "rational_spatial_scale" not in config
    assert {"upsampler.0.weight", "upsampler.0.bias", "initial_conv.weight", "final_conv.bias"} <= keys


def test_config_renamed_and_never_left_to_diffusers_defaults():
    """spatial_scale → rational_spatial_scale, rational_resampler → use_rational_resampler; a file that omits
    rational_resampler gets the reference default False, not diffusers' True."""
    config = ups.UpsamplerConfig.from_metadata("f", {"config": {"_class_name": "LatentUpsampler", "mid_channels": 64}})
    kwargs = config.diffusers_kwargs()
    assert kwargs["use_rational_resampler"] is False and kwargs["rational_spatial_scale"] == 2.0
    assert kwargs["mid_channels"] == 64 and "spatial_scale" not in kwargs and "rational_resampler" not in kwargs


def test_unsupported_config_values_name_the_key():
    """in_channels ≠ 128, mid_channels not a multiple of 32, or another class name are refused by key."""
    for bad, key in [({"in_channels": 64}, "config.in_channels"), ({"mid_channels": 48}, "config.mid_channels"),
                     ({"_class_name": "Other"}, "config._class_name"), ({"spatial_scale": 1.5}, "config.spatial_scale")]:
        with pytest.raises(LTX25Error) as info:
            ups.UpsamplerConfig.from_metadata("f", {"config": {"_class_name": "LatentUpsampler", **bad}})
        assert info.value.what == key, str(info.value)


def test_loads_strictly_with_identical_keys(tiny_file, tiny_upsampler):
    """Every file tensor lands in the module under the same name, bit for bit."""
    native = load_file(tiny_file("upsampler"))
    state = tiny_upsampler.state_dict()
    assert native.keys() == state.keys()
    assert all(torch.equal(native[k].float(), state[k]) for k in native)


def test_config_and_keys_disagreeing_refused(tiny_file, tmp_path):
    """Metadata saying rational_resampler true over `upsampler.0.*` keys is refused before building anything."""
    tensors = load_file(tiny_file("upsampler"))
    config = dict(TINY_CONFIG, rational_resampler=True)
    path = str(tmp_path / "mismatch.safetensors")
    save_file(tensors, path, metadata={"config": json.dumps(config)})
    with pytest.raises(LTX25Error, match="resampler keys"):
        ups.load_upsampler(path)


def test_missing_tensor_refused(tiny_file, tmp_path):
    """A file short of one tensor fails the coverage check naming it."""
    tensors = load_file(tiny_file("upsampler"))
    tensors.pop("final_conv.bias")
    path = str(tmp_path / "short.safetensors")
    save_file(tensors, path, metadata={"config": json.dumps(TINY_CONFIG)})
    with pytest.raises(LTX25Error, match="final_conv.bias"):
        ups.load_upsampler(path)


def test_upsample_shape_and_statistics_wrapping(tiny_upsampler):
    """[1,128,16,8,12] → [1,128,16,16,24]; the output equals normalize(upsampler(un_normalize(x))) with the VAE
    statistics — skipping either side of the wrapping changes the result by far more than the tolerance."""
    mean, std = latent_statistics(0)
    mean, std = mean + 0.5, std * 1.5  # make the statistics matter
    x = torch.randn(1, 128, 16, 8, 12, generator=torch.Generator().manual_seed(0))
    got = ups.upsample_latent(tiny_upsampler, x, mean, std)
    assert got.shape == (1, 128, 16, 16, 24)
    m, s = mean.view(1, -1, 1, 1, 1), std.view(1, -1, 1, 1, 1)
    with torch.inference_mode():
        want = (tiny_upsampler(x * s + m) - m) / s
        no_unnormalize = (tiny_upsampler(x) - m) / s
    assert (got - want).abs().max() < 1e-4, f"max diff {(got - want).abs().max()}"
    assert (got - no_unnormalize).abs().max() > 1e-2


def test_latent_upsample_node(tiny_file):
    """The node reads the video VAE's latents_mean/latents_std buffers, doubles H and W and keeps frame_rate."""
    path = tiny_file("upsampler")
    handle = Loaded.register(ups.load_upsampler(path, torch.float32), SimpleNamespace(name="up"))
    vae = torch.nn.Module()
    mean, std = latent_statistics(0)
    vae.register_buffer("latents_mean", mean)
    vae.register_buffer("latents_std", std)
    vae_handle = Loaded(vae, None, SimpleNamespace(name="vae"))
    (out,) = LTX25LatentUpsample().upsample(handle, vae_handle, {"samples": torch.randn(1, 128, 2, 3, 4),
                                                                 "frame_rate": 24.0})
    assert out["samples"].shape == (1, 128, 2, 6, 8) and out["frame_rate"] == 24.0
    with pytest.raises(LTX25Error, match="latent statistics"):
        LTX25LatentUpsample().upsample(handle, Loaded(torch.nn.Module(), None, None), {"samples": out["samples"]})


def test_latent_upsample_refuses_the_audio_latent_and_empty_latents_by_name(tiny_file):
    """Both sampler outputs are LATENT, so wiring the audio one here is legal in the canvas: it is refused naming
    the input and Audio Decode (it was `ValueError: not enough values to unpack`); an empty latent is refused
    before any kernel sees it."""
    handle = Loaded.register(ups.load_upsampler(tiny_file("upsampler"), torch.float32), SimpleNamespace(name="up"))
    vae = torch.nn.Module()
    for name, value in zip(("latents_mean", "latents_std"), latent_statistics(0)):
        vae.register_buffer(name, value)
    vae_handle = Loaded(vae, None, SimpleNamespace(name="vae"))
    audio = {"samples": torch.zeros(1, 8, 26, 16), "type": "audio", "frame_rate": 24.0}
    with pytest.raises(LTX25Error, match="LTX25LatentUpsample.video_latent: .*Audio Decode"):
        LTX25LatentUpsample().upsample(handle, vae_handle, audio)
    for shape in ((1, 128, 0, 3, 4), (1, 128, 2, 3, 0), (0, 128, 2, 3, 4)):
        with pytest.raises(LTX25Error, match="LTX25LatentUpsample.video_latent: the latent shape"):
            LTX25LatentUpsample().upsample(handle, vae_handle, {"samples": torch.zeros(shape)})
