"""The audio VAE + vocoder (docs/MODEL.md §11, §12): native nested config → diffusers modules, strict key map with the
vocoder renames, fp32 vocoder, (channel, bin) statistics, output length/rate, the drift warning and the node."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LTX2AudioPixelNorm
from safetensors import safe_open
from safetensors.torch import load_file

from nodes.comfy.audio import LTX25AudioDecode
from nodes.comfy.handles import Loaded
from nodes.ltx import audio_vae as av
from nodes.ltx.files.assets import inspect_asset
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import KeyMap, check_coverage
from nodes.tools.tiny.audio_vae import TINY_AUDIO_VAE_CONFIG, TINY_VOCODER_CONFIG

T_17_FRAMES_24FPS = 18          # round(17 / 24 · 25): 0.7 s of audio keeps the vocoder tests fast (one shape)


@pytest.fixture(scope="module")
def audio_vae(tiny_file):
    return av.load_audio_vae(tiny_file("audio_vae"), torch.bfloat16)


def _latent(t=T_17_FRAMES_24FPS, seed=0):
    return torch.randn(1, 8, t, 16, generator=torch.Generator().manual_seed(seed))


def test_tiny_file_is_native_format(tiny_file):
    """Native prefixes and names (`audio_vae.{encoder,decoder,per_channel_statistics}`, `vocoder.vocoder.ups`,
    `conv_pre`, `resblocks`, `act_post`, `downsample.lowpass`, `vocoder.mel_stft`) and the nested native config."""
    with safe_open(tiny_file("audio_vae"), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    config = json.loads(meta["config"])
    assert config["audio_vae"]["model"]["params"]["ddconfig"]["z_channels"] == 8
    assert config["vocoder"]["bwe"]["output_sampling_rate"] == 48000
    assert {"audio_vae.decoder.conv_in.conv.weight", "audio_vae.encoder.conv_in.conv.weight",
            "audio_vae.per_channel_statistics.mean-of-means", "vocoder.vocoder.conv_pre.weight",
            "vocoder.vocoder.ups.0.weight", "vocoder.bwe_generator.resblocks.0.convs1.0.weight",
            "vocoder.vocoder.act_post.downsample.lowpass.filter", "vocoder.mel_stft.mel_basis",
            "vocoder.mel_stft.stft_fn.forward_basis"} <= keys
    assert not any(".upsamplers." in k or ".resnets." in k or "conv_in" in k and k.startswith("vocoder") for k in keys)


def test_every_key_map_row_is_needed(tiny_file, audio_vae):
    """Full coverage: the file loads (fixture), and without any one rename row or the encoder drop the coverage
    check `load_strict` runs fails."""
    path = tiny_file("audio_vae")
    native = load_file(path)
    meta = inspect_asset(path).header.metadata
    with torch.device("meta"):
        module = av.AudioVAE(av.AudioVAEConfig.from_metadata(path, meta), av.vocoder_kwargs(path, meta))
    rows = av.KEY_MAP.renames
    variants = [KeyMap("variant", rows[:i] + rows[i + 1:], (), av.KEY_MAP.drops) for i in range(len(rows))]
    variants.append(KeyMap("variant", rows, (), av.KEY_MAP.drops[1:]))
    check_coverage(path, av.KEY_MAP, module, av.KEY_MAP.apply(native)[0])
    for key_map in variants:
        with pytest.raises(LTX25Error, match="key coverage"):
            check_coverage(path, key_map, module, key_map.apply(native)[0])


def test_values_that_differ_from_diffusers_defaults_come_from_the_file(audio_vae):
    """`LTX2AudioDecoder` defaults to group norm, width causality and mono; the file says pixel norm, height,
    stereo. The reference clamps the first vocoder stage (diffusers' converter: no final activation) and builds
    the BWE mel STFT with window = n_fft."""
    decoder, vocoder = audio_vae.decoder, audio_vae.vocoder
    assert isinstance(decoder.norm_out, LTX2AudioPixelNorm)
    assert decoder.causality_axis == "height" and decoder.out_ch == 2 and decoder.mel_bins == 64
    assert vocoder.vocoder.final_act_fn == "clamp" and vocoder.bwe_generator.final_act_fn is None
    assert vocoder.mel_stft.stft_fn.window_length == 512 and vocoder.config.output_sampling_rate == 48000


@pytest.mark.parametrize("section, change, key", [
    ("ddconfig", {"mid_block_add_attention": True}, "mid_block_add_attention"),
    ("ddconfig", {"norm_type": "group"}, "norm_type"),
    ("ddconfig", {"z_channels": 4}, "z_channels"),
    ("bwe", {"activation": "snake"}, "config.vocoder.bwe.activation"),
])
def test_unsupported_config_values_name_the_key(section, change, key):
    """Unsupported values are refused by key before anything is built."""
    audio = json.loads(json.dumps(TINY_AUDIO_VAE_CONFIG))
    vocoder = json.loads(json.dumps(TINY_VOCODER_CONFIG))
    (audio["model"]["params"]["ddconfig"] if section == "ddconfig" else vocoder[section]).update(change)
    metadata = {"config": {"audio_vae": audio, "vocoder": vocoder}}
    with pytest.raises(LTX25Error) as info:
        av.AudioVAEConfig.from_metadata("f", metadata)
        av.vocoder_kwargs("f", metadata)
    assert info.value.what.endswith(key), str(info.value)


def test_vocoder_runs_in_float32_with_bf16_weights(audio_vae):
    """Loaded in bf16, the decoder keeps bf16 weights but the vocoder is float32 and computes in float32 (bf16
    accumulation through its ~100 convolutions degrades the spectrum)."""
    assert {p.dtype for p in audio_vae.decoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in audio_vae.vocoder.parameters()} == {torch.float32}
    seen = []
    hooks = [m.register_forward_hook(lambda _m, args, _out: seen.append(args[0].dtype))
             for m in (audio_vae.vocoder.vocoder.conv_in, audio_vae.vocoder.bwe_generator.conv_out)]
    try:
        av.decode_audio(audio_vae, _latent())
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == [torch.float32, torch.float32], seen


def test_audio_length_matches_the_video_duration(audio_vae):
    """17 frames at 24 fps → T = 18 latent frames → 480·(4T−3) = 33 120 samples at 48 kHz, within one latent
    hop (1920 samples) of round(17/24·48000) = 34 000; stereo, in [−1, 1]."""
    audio = av.decode_audio(audio_vae, _latent(), fps=24.0)
    waveform = audio["waveform"]
    assert audio["sample_rate"] == 48000 and waveform.shape == (1, 2, 480 * (4 * T_17_FRAMES_24FPS - 3))
    assert abs(waveform.shape[-1] - round(17 / 24 * 48000)) <= 1920
    assert waveform.abs().max() <= 1 and waveform.std() > 1e-3 and waveform.dtype == torch.float32


def test_statistics_unnormalize_per_channel_and_bin(audio_vae):
    """The 128 statistics are indexed channel-major (c·16 + bin), as the latent is patchified `(c f)`; the decoder
    sees `latent·std + mean` in that layout (a transposed (bin, channel) layout gives another mel)."""
    z = _latent()
    seen = []
    hook = audio_vae.decoder.conv_in.register_forward_hook(lambda _m, args, _out: seen.append(args[0].float()))
    try:
        av.decode_audio(audio_vae, z)
    finally:
        hook.remove()
    mean, std = audio_vae.latents_mean.float(), audio_vae.latents_std.float()
    expected = (z * std.view(1, 8, 1, 16) + mean.view(1, 8, 1, 16)).bfloat16().float()
    transposed = (z * std.view(16, 8).t().reshape(1, 8, 1, 16) + mean.view(16, 8).t().reshape(1, 8, 1, 16))
    assert torch.equal(seen[0], expected)
    assert (seen[0] - transposed).abs().max() > 0.01


def test_drift_between_audio_and_video_is_warned(audio_vae, caplog):
    """The audio of a 17-frame clip at 24 fps fits (no warning); the same latent said to belong to 121 frames at
    25 fps drifts by seconds and is warned about."""
    z = _latent()
    with caplog.at_level(logging.WARNING, logger="ltx25"):
        av.decode_audio(audio_vae, z, fps=24.0)
        assert not caplog.records
        av.decode_audio(audio_vae, z, fps=25.0, frames=121)
    assert any("drift" in r.getMessage() for r in caplog.records)


def test_video_frames_inferred_from_audio_latent_length():
    """T = round(F/fps·25) inverts to the unique 8k+1 frame count (126 @ 24 fps → 121, 121 @ 25 → 121); a length
    no 8k+1 clip has gives None."""
    assert av.video_frames_for(126, 24.0) == 121 and av.video_frames_for(18, 24.0) == 17
    assert av.video_frames_for(121, 25.0) == 121 and av.video_frames_for(3, 24.0) is None


def test_bad_audio_latents_are_refused():
    """A video latent or a wrong channel count is named as such."""
    with pytest.raises(LTX25Error, match="video decode node"):
        av.check_audio_latent(torch.zeros(1, 128, 2, 2, 2), "x")
    with pytest.raises(LTX25Error, match=r"\[B, 8, T, 16\]"):
        av.check_audio_latent(torch.zeros(1, 4, 26, 16), "x")
    for empty in ((1, 8, 0, 16), (0, 8, 26, 16)):  # a kernel error deep in the decoder before
        with pytest.raises(LTX25Error, match=r"x: the audio latent shape .*T ≥ 1"):
            av.check_audio_latent(torch.zeros(empty), "x")


def test_audio_decode_node_returns_audio(tiny_file, audio_vae):
    """LATENT {"samples", "type": "audio", "frame_rate"} → AUDIO {"waveform": [B, 2, S], "sample_rate": 48000}."""
    loaded = Loaded.register(audio_vae, inspect_asset(tiny_file("audio_vae")))
    latent = {"samples": _latent(), "type": "audio", "frame_rate": 24.0}
    (audio,) = asyncio.run(LTX25AudioDecode().decode(loaded, latent))
    assert audio["sample_rate"] == 48000 and audio["waveform"].shape[:2] == (1, 2)
