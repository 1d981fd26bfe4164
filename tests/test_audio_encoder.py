"""The audio VAE encoder (docs/MODEL.md §17.3): resampling and the log-mel against the reference's formulas computed
independently, the encoder equal to diffusers' run by hand on the tiny file, strict keys, the latent length rules,
and the refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LTX2AudioEncoder
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nodes.comfy import bridge
from nodes.ltx.audio_vae import video_frames_for
from nodes.ltx.encode import audio_encoder as ae
from nodes.ltx.encode.mel import log_mel, resample
from nodes.ltx.errors import LTX25Error
from nodes.ltx.files.keymap import KeyMap, check_coverage
from nodes.ltx.geometry import audio_latent_frames


@pytest.fixture(scope="module")
def encoder(tiny_file):
    return ae.load_audio_encoder(tiny_file("audio_vae"), torch.float32)


def _noise(*shape, seed=0, scale=0.3):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------------------------------------- preprocessing
@pytest.mark.parametrize("orig, new", [(44100, 16000), (48000, 16000), (22050, 16000), (8000, 16000)])
def test_resample_is_the_references_windowed_sinc(orig, new):
    """Every output sample is the reference's interpolation (torchaudio's defaults) evaluated directly in float64:
    y[j] = Σᵢ x[i]·(c/o)·sinc(π·t)·cos²(π·t/12) with t = c·(i/o − j/n) for |t| < 6, rates o, n divided by their
    gcd and c = 0.99·min(o, n); ceil(N·n/o) outputs. Down- and upsampling."""
    x = _noise(1, 2, 700, seed=orig)
    got = resample(x, orig, new)
    gcd = math.gcd(orig, new)
    o, n = orig // gcd, new // gcd
    cutoff = 0.99 * min(o, n)
    length = math.ceil(700 * n / o)
    t = cutoff * (np.arange(700)[None, :] / o - np.arange(length)[:, None] / n)
    kernel = np.where(np.abs(t) < 6, np.sinc(t) * np.cos(np.pi * t / 12) ** 2, 0.0) * cutoff / o
    expected = x.double().numpy() @ kernel.T
    assert got.shape == (1, 2, length)
    assert np.abs(got.double().numpy() - expected).max() < 1e-5, float(np.abs(got.numpy() - expected).max())
    assert torch.equal(resample(x, new, new), x)


def _slaney_mel(hz):
    hz = np.asarray(hz, dtype=np.float64)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, hz * 3.0 / 200.0)


def _slaney_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * 200.0 / 3.0)


def test_log_mel_is_the_references_formula():
    """The mel spectrogram written out from its definition in numpy: reflect-pad n_fft/2, periodic Hann window,
    |rFFT| every hop (power 1), 64 triangles evenly spaced on the slaney mel scale (linear to 1 kHz, logarithmic
    above) from 0 to 8 kHz, each scaled by 2/(f₊ − f₋), then log(max(·, 1e-5)); `[B, C, N//160 + 1, 64]`."""
    rate, n_fft, hop, mels = 16000, 1024, 160, 64
    x = _noise(1, 2, 4000, seed=5)
    got = log_mel(x, rate, n_fft, hop, mels)
    signal = np.pad(x.double().numpy(), ((0, 0), (0, 0), (n_fft // 2, n_fft // 2)), mode="reflect")
    count = 4000 // hop + 1
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = np.stack([signal[..., i * hop:i * hop + n_fft] * window for i in range(count)], axis=2)
    magnitude = np.abs(np.fft.rfft(frames, axis=-1))                           # [1, 2, frames, 513]
    freqs = np.linspace(0, rate // 2, n_fft // 2 + 1)
    edges = _slaney_hz(np.linspace(_slaney_mel(0.0), _slaney_mel(rate / 2), mels + 2))
    rising = (freqs[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - freqs[:, None]) / (edges[2:] - edges[1:-1])
    bank = np.maximum(0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))
    expected = np.log(np.maximum(magnitude @ bank, 1e-5))
    assert got.shape == (1, 2, count, mels) and got.dtype == torch.float32
    assert np.abs(got.double().numpy() - expected).max() < 1e-3, float(np.abs(got.numpy() - expected).max())


# ------------------------------------------------------------------------------------------------- file and keys
def test_encode_equals_diffusers_run_by_hand(tiny_file, encoder):
    """The encode is diffusers' `LTX2AudioEncoder` (arguments written out for the tiny file: width 128, ×(1,1,1),
    one resnet per level, pixel norm, causal along time) on the log-mel of the 16 kHz waveform, the first 8 of its
    16 channels, normalized per (channel, bin) with the file's 128 statistics at index c·16 + f."""
    path = tiny_file("audio_vae")
    model = LTX2AudioEncoder(base_channels=128, num_res_blocks=1, in_channels=2, latent_channels=8, ch_mult=(1, 1, 1),
                             norm_type="pixel", causality_axis="height", mid_block_add_attention=False,
                             double_z=True).eval()
    native = load_file(path)
    model.load_state_dict({k[len("audio_vae.encoder."):]: v.float() for k, v in native.items()
                           if k.startswith("audio_vae.encoder.")}, strict=True)
    waveform = _noise(1, 2, 44100, seed=6)
    with torch.no_grad():
        means = model(log_mel(resample(waveform, 44100, 16000), 16000, 1024, 160, 64))[:, :8]
    mean = native["audio_vae.per_channel_statistics.mean-of-means"].float().view(1, 8, 1, 16)
    std = native["audio_vae.per_channel_statistics.std-of-means"].float().view(1, 8, 1, 16)
    expected = (means - mean) / std
    latent = ae.encode_audio(encoder, waveform, 44100)
    assert latent.shape == (1, 8, 26, 16) and latent.dtype == torch.float32 and latent.device.type == "cpu"
    assert torch.allclose(latent, expected, atol=1e-4 * float(expected.abs().max())), \
        float((latent - expected).abs().max())


def test_every_key_map_row_is_needed(tiny_file, encoder):
    """Full coverage from the file, and without any one rename row the coverage check fails."""
    path = tiny_file("audio_vae")
    native = {k: v for k, v in load_file(path).items() if k.startswith(ae.READ_PREFIXES)}
    with torch.device("meta"):
        module = ae.AudioEncoder(encoder.config, encoder.n_fft)
    check_coverage(path, ae.KEY_MAP, module, ae.KEY_MAP.apply(native)[0])
    rows = ae.KEY_MAP.renames
    for i in range(len(rows)):
        variant = KeyMap("variant", rows[:i] + rows[i + 1:], (), ae.KEY_MAP.drops)
        with pytest.raises(LTX25Error, match="key coverage"):
            check_coverage(path, variant, module, variant.apply(native)[0])


def _rewrite(source: str, target: str, change) -> str:
    tensors = load_file(source)
    change(tensors)
    with safe_open(source, "pt") as f:
        save_file(tensors, target, metadata=f.metadata())
    return target


@pytest.mark.parametrize("change, found", [
    (lambda t: t.pop("audio_vae.encoder.conv_out.conv.weight"), "audio_vae.encoder.conv_out.conv.weight"),
    (lambda t: t.update({"audio_vae.encoder.extra.weight": torch.zeros(1)}), "audio_vae.encoder.extra.weight"),
    (lambda t: t.update({"model.diffusion_model.x": torch.zeros(1)}), "model.diffusion_model.x"),
])
def test_missing_extra_or_stray_tensors_are_named(tiny_file, tmp_path, change, found):
    """A missing encoder tensor, an extra one, or a tensor of no known part of the audio VAE file: refused by
    name. The decoder's and the vocoder's tensors are dropped by name (the tiny file loads)."""
    path = _rewrite(tiny_file("audio_vae"), str(tmp_path / "changed.safetensors"), change)
    with pytest.raises(LTX25Error, match=found.replace(".", r"\.")):
        ae.load_audio_encoder(path)
    with safe_open(tiny_file("audio_vae"), "pt") as f:
        others = [k for k in f.keys() if not k.startswith(ae.READ_PREFIXES)]
    assert any(k.startswith("vocoder.") for k in others) and all(ae.KEY_MAP.drop_reason(k) for k in others)


# ------------------------------------------------------------------------------------------------- lengths
@pytest.mark.parametrize("samples, rate", [(44100, 44100), (16000 * 2 + 123, 16000), (24000, 48000), (600, 16000)])
def test_latent_length_for_a_waveform(encoder, samples, rate):
    """`latent_frames_for_samples` predicts the encode's T: ceil-resampled length, N//160 + 1 mel frames, every
    fourth kept by the causal encoder (44.1 kHz · 1 s → 26)."""
    latent = ae.encode_audio(encoder, _noise(1, 2, samples, seed=samples), rate)
    assert latent.shape[2] == ae.latent_frames_for_samples(encoder, samples, rate)


def test_clip_length_rule_is_the_samplers_and_has_its_inverse():
    """`audio_latent_length(F, fps)` is the sampler's round(F/fps·25) (121 frames at 24 fps → 126, not ceil's
    127), and `video_frames_for` inverts it on 8k+1 frame counts."""
    assert ae.audio_latent_length(121, 24.0) == 126 == audio_latent_frames(121, 24.0)
    for frames in (1, 9, 17, 97, 121, 241):
        for fps in (24.0, 25.0, 30.0):
            assert video_frames_for(ae.audio_latent_length(frames, fps), fps) == frames, (frames, fps)


# ------------------------------------------------------------------------------------------------- encode
def test_mono_is_encoded_as_both_channels(encoder):
    """A mono waveform for the stereo encoder is copied to both channels (as ComfyUI's audio encode does)."""
    mono = _noise(1, 1, 16000, seed=7)
    assert torch.equal(ae.encode_audio(encoder, mono, 16000), ae.encode_audio(encoder, mono.repeat(1, 2, 1), 16000))


def test_weights_run_in_the_loaded_dtype(tiny_file):
    """`dtype` casts the encoder (bf16); the mel is float32 and the latent comes back float32."""
    bf16 = ae.load_audio_encoder(tiny_file("audio_vae"), torch.bfloat16)
    assert next(bf16.encoder.parameters()).dtype == torch.bfloat16
    assert ae.encode_audio(bf16, _noise(1, 2, 16000), 16000).dtype == torch.float32


@pytest.mark.parametrize("waveform, rate, what", [
    (torch.zeros(1, 2, 0), 16000, "audio length is 0 samples"),
    (torch.zeros(1, 2, 400), 16000, "audio length is 400 samples"),
    (torch.zeros(1, 3, 16000), 16000, "shape"),
    (torch.zeros(2, 16000), 16000, "waveform is [2, 16000]"),
    (torch.zeros(0, 2, 16000), 16000, "shape"),
    (torch.zeros(1, 2, 16000), 0, "sample rate is 0"),
    (torch.zeros(1, 2, 16000), 44100.5, "sample rate is 44100.5"),
])
def test_bad_audio_is_refused_by_name(encoder, waveform, rate, what):
    """No samples, fewer than the STFT's half window, three channels, no channel axis, no batch, a bad rate: each
    an LTX25Error naming the input."""
    with pytest.raises(LTX25Error, match="encode_audio.audio") as error:
        ae.encode_audio(encoder, waveform, rate)
    assert what in str(error.value), error.value


def test_an_interrupt_stops_inside_the_encode(encoder):
    """The check runs before the encoder's blocks (its stages are containers diffusers never calls, so the blocks
    are hooked): a raised interrupt ends the encode; the hooks are gone afterwards."""
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise bridge.InterruptError("stop")

    with pytest.raises(bridge.InterruptError):
        ae.encode_audio(encoder, _noise(1, 2, 16000), 16000, check=check)
    assert len(calls) == 3 and ae.encode_audio(encoder, _noise(1, 2, 16000), 16000).shape[2] == 26
