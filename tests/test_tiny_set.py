"""The tiny set loads in the other readers of the released files, not only in this pack's loaders: each file's
tensors have the shapes its own metadata declares, read the way ComfyUI core's and Lightricks' builders read it
(their defaults where a field is absent). This pack drops the bundled encoders and sizes the audio statistics itself,
so its own loading tests cannot see such a mismatch."""
from __future__ import annotations

import math
from typing import Any, Mapping

import pytest
from safetensors import safe_open

from nodes.ltx.audio_vae import LATENT_BINS, LATENT_CHANNELS
from nodes.ltx.files.assets import read_header

# the reference encoder's space-to-depth strides per block name (docs/MODEL.md §9.1)
DOWNSAMPLE_STRIDES = {"compress_space_res": (1, 2, 2), "compress_time_res": (2, 1, 1), "compress_all_res": (2, 2, 2)}
LOG_VAR_CHANNELS = {"constant": 1, "uniform": 1, "none": 0}  # "per_channel" doubles the output instead


def encoder_shapes(blocks: list, base_channels: int, patch_size: int, in_channels: int, out_channels: int,
                   latent_log_var: str) -> dict[str, tuple[int, ...]]:
    """Every `encoder.*` tensor the reference conv encoder (ComfyUI's `Encoder`, ltx-core's) builds from a config:
    conv_in to `base_channels`; per block, res_x's convolutions at the running width or a space-to-depth conv whose
    output is the new width (× multiplier, default 2) over the stride volume; conv_out to the latent (+ log-var)."""
    width = base_channels
    shapes = {"encoder.conv_in.conv.weight": (width, in_channels * patch_size ** 2, 3, 3, 3),
              "encoder.conv_in.conv.bias": (width,)}
    for index, (name, params) in enumerate(blocks):
        params = {"num_layers": params} if isinstance(params, int) else params
        if name == "res_x":
            for layer in range(params["num_layers"]):
                for conv in ("conv1", "conv2"):
                    prefix = f"encoder.down_blocks.{index}.res_blocks.{layer}.{conv}.conv"
                    shapes |= {f"{prefix}.weight": (width, width, 3, 3, 3), f"{prefix}.bias": (width,)}
        else:
            new_width = width * params.get("multiplier", 2)
            conv_out = new_width // math.prod(DOWNSAMPLE_STRIDES[name])
            prefix = f"encoder.down_blocks.{index}.conv.conv"
            shapes |= {f"{prefix}.weight": (conv_out, width, 3, 3, 3), f"{prefix}.bias": (conv_out,)}
            width = new_width
    latent = out_channels * 2 if latent_log_var == "per_channel" else out_channels + LOG_VAR_CHANNELS[latent_log_var]
    return shapes | {"encoder.conv_out.conv.weight": (latent, width, 3, 3, 3), "encoder.conv_out.conv.bias": (latent,)}


def _stored(path: str, prefix: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(t.shape) for k, t in read_header(path).tensors.items() if k.startswith(prefix)}


def _declared_by_diffusion_file(vae: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    encoder = vae["encoder"]  # ComfyUI's CausalDiffusionVAE defaults
    return encoder_shapes(encoder["blocks"], encoder.get("base_channels", 128), encoder.get("patch_size", 4),
                          encoder.get("in_channels", 3), encoder.get("out_channels", 128),
                          encoder.get("latent_log_var", "constant"))


def _declared_by_conv_file(vae: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return encoder_shapes(vae["encoder_blocks"], vae.get("encoder_base_channels", 128), vae.get("patch_size", 1),
                          vae.get("in_channels", 3), vae.get("latent_channels", 128),
                          vae.get("latent_log_var", "per_channel"))


@pytest.mark.parametrize("component, declared", [("diffusion_vae", _declared_by_diffusion_file),
                                                 ("conv_vae", _declared_by_conv_file)])
def test_bundled_encoder_has_the_tensors_its_config_declares(tiny_file, component, declared):
    """The `encoder.*` tensors are exactly those a reader builds from the file's own encoder config, shapes
    included. Breaks when a writer stores a stand-in of other widths or leaves out tensors its blocks imply: ComfyUI's
    VAELoader then refuses the file ("size mismatch for encoder.conv_in.conv.weight")."""
    path = tiny_file(component)
    expected = declared(read_header(path).metadata["config"]["vae"])
    assert _stored(path, "encoder.") == expected


def test_audio_statistics_are_as_long_as_the_config_ch(tiny_file):
    """Lightricks' audio VAE sizes `per_channel_statistics` by `ddconfig.ch` and un-normalizes the (channel, bin)-
    flattened latent with them: `ch` must equal the stored statistics' length, which is latent channels × bins (128
    in the released file). Breaks when the tiny file declares a narrower `ch` than the statistics it stores."""
    path = tiny_file("audio_vae")
    ddconfig = read_header(path).metadata["config"]["audio_vae"]["model"]["params"]["ddconfig"]
    with safe_open(path, "pt") as f:
        lengths = {f.get_slice(f"audio_vae.per_channel_statistics.{name}").get_shape()[0]
                   for name in ("mean-of-means", "std-of-means")}
    assert lengths == {ddconfig["ch"]} == {LATENT_CHANNELS * LATENT_BINS}
