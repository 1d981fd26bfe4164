"""The LTX-2.5 audio VAE encoder (docs/MODEL.md §17.3): a waveform → resampled to 16 kHz → log-mel → diffusers'
`LTX2AudioEncoder` → normalized latent `[B, 8, T, 16]`, loaded strictly from `audio_vae.encoder.*` and the
statistics of the audio VAE file, configured from its `config.audio_vae` (the decoder's `AudioVAEConfig`, plus the
STFT size the mel needs).

Lengths: N samples at 16 kHz give N // 160 + 1 mel frames (`mel.mel_frames`) and the causal encoder keeps every
fourth, starting with the first: T = (mel frames − 1) // 4 + 1 latent frames (`latent_frames_for_samples`). A clip
of F video frames at fps has T = round(F / fps · 25) audio latent frames (`audio_latent_length`); the reference
crops or zero-pads an encoded clip to that length before conditioning on it.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR, LTX2AudioEncoder

from ..audio_vae import LATENT_BINS, LATENT_CHANNELS, AudioVAEConfig
from ..errors import LTX25Error
from ..files.assets import Kind, expect_kind, read_state_dict
from ..files.config import config_field
from ..files.keymap import Drop, KeyMap, Rename, check_unread, load_strict
from ..files.vae_layout import statistics_renames, unused_statistics
from ..geometry import audio_latent_frames
from ..stop_points import checked_before
from .mel import log_mel, mel_frames, resample
from ..cpu_convolutions import float32_convolutions

READ_PREFIXES = ("audio_vae.encoder.", "audio_vae.per_channel_statistics.")
KEY_MAP = KeyMap(
    "audio VAE encoder",
    renames=(
        Rename("audio_vae.encoder", "encoder"),
        *statistics_renames("audio_vae."),
    ),
    drops=(
        Drop(r"audio_vae\.decoder\..*", "the audio decoder: LTX-2.5 Load Audio VAE builds it"),
        Drop(r"vocoder\..*", "the vocoder (and its bandwidth extension): the decode side"),
        unused_statistics("audio_vae.", "dataset statistics the normalization does not use"),
    ),
)


class AudioEncoder(torch.nn.Module):
    """LTX25_AUDIO_ENCODER: `encoder` (diffusers `LTX2AudioEncoder`: stereo log-mel `[B, 2, M, 64]` → means and
    log-variances `[B, 16, T, 16]`) and the per-(channel, bin) statistics `latents_mean`/`latents_std` `[128]`
    (index c·16 + f), with the mel settings of the file (`sample_rate`, `hop_length`, `n_fft`, `mel_bins`)."""
    kind = "audio encoder"

    def __init__(self, config: AudioVAEConfig, n_fft: int) -> None:
        super().__init__()
        self.config = config
        self.n_fft = n_fft
        self.encoder = LTX2AudioEncoder(**config.module_kwargs(), double_z=config.double_z)
        self.register_buffer("latents_mean", torch.zeros(LATENT_CHANNELS * LATENT_BINS))
        self.register_buffer("latents_std", torch.ones(LATENT_CHANNELS * LATENT_BINS))

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate


def encoder_settings(where: str, metadata: Mapping[str, Any]) -> tuple[AudioVAEConfig, int]:
    """(the audio VAE config, the STFT size) for the encoder: the decoder's config and the values only the encoder
    reads, each refused when the pack's encoder would not match the reference's."""
    config = AudioVAEConfig.from_metadata(where, metadata)
    dd = "audio_vae.model.params.ddconfig"
    for key in ("double_z", "resamp_with_conv"):  # means + log-variances; strided-conv downsampling (diffusers' only)
        config_field(where, metadata, f"{dd}.{key}", True, allowed=(True,),
                     hint="LTX-2.5 audio VAE files ship this value; the file is from another model.")
    n_fft = config_field(where, metadata, "audio_vae.preprocessing.stft.filter_length", 1024, kind=int)
    if n_fft < 2 or n_fft % 2:
        raise LTX25Error(where, "config.audio_vae.preprocessing.stft.filter_length", n_fft, "an even STFT size ≥ 2")
    return config, n_fft


def load_audio_encoder(path: str, dtype: torch.dtype | None = None) -> AudioEncoder:
    """Audio VAE file → `AudioEncoder` (eval, no grad), strictly: every `audio_vae.encoder.*` tensor and both
    statistics used, the decoder and vocoder dropped by name. `dtype` casts the weights (None: as stored)."""
    info = expect_kind(path, Kind.AUDIO_VAE)
    if not any(k.startswith("audio_vae.encoder.") for k in info.header.tensors):
        raise LTX25Error(info.path, "the encoder tensors (audio_vae.encoder.*)", "absent", "the audio VAE's encoder",
                         "This copy of the file was stripped to its decoder; use the official file.")
    config, n_fft = encoder_settings(info.path, info.header.metadata)
    check_unread(info.path, info.header.tensors, READ_PREFIXES, KEY_MAP)
    return load_strict(info.path, lambda: AudioEncoder(config, n_fft),
                       read_state_dict(info.path, prefixes=READ_PREFIXES), KEY_MAP, dtype)


# ------------------------------------------------------------------------------------------------------ encode
def audio_latent_length(frames: int, fps: float) -> int:
    """The audio latent frames T of a clip of `frames` video frames at `fps`: round(frames / fps · 25), the
    sampler's rule (`geometry.audio_latent_frames`; its inverse is `audio_vae.video_frames_for`)."""
    return audio_latent_frames(frames, fps)


def resampled_length(samples: int, orig_rate: int, new_rate: int) -> int:
    """Samples after resampling `samples` from `orig_rate` to `new_rate` (`mel.resample` keeps ceil(N·new/orig))."""
    return samples if orig_rate == new_rate else -(-samples * new_rate // orig_rate)


def latent_frames_for_samples(encoder: AudioEncoder, samples: int, sample_rate: int) -> int:
    """Latent frames T that `encode_audio` makes from `samples` samples at `sample_rate`."""
    mel = mel_frames(resampled_length(samples, sample_rate, encoder.sample_rate), encoder.config.mel_hop_length)
    return (mel - 1) // LATENT_DOWNSAMPLE_FACTOR + 1


def check_waveform(waveform: object, sample_rate: object, encoder: AudioEncoder, where: str) -> torch.Tensor:
    """A float waveform `[B, C, N]` with C the encoder's channels (mono is accepted for a stereo encoder, copied to
    both channels as ComfyUI does) and enough samples for the centred STFT; else an error naming `where`."""
    if not isinstance(waveform, torch.Tensor) or not waveform.is_floating_point() or waveform.ndim != 3:
        found = list(waveform.shape) if isinstance(waveform, torch.Tensor) else type(waveform).__name__
        raise LTX25Error(where, "the waveform", found, "a float tensor [B, channels, samples] (ComfyUI AUDIO)",
                         "Connect an AUDIO from a Load Audio or a video loader.")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral) or sample_rate <= 0:
        raise LTX25Error(where, "the sample rate", repr(sample_rate), "a positive whole number of Hz")
    channels = encoder.config.in_channels
    if waveform.shape[1] not in (channels, 1) or waveform.shape[0] == 0:
        raise LTX25Error(where, "the waveform's shape", list(waveform.shape), f"[B ≥ 1, {channels} (or 1), samples]",
                         f"Mix the audio down to {channels} channels first.")
    least = encoder.n_fft // 2 + 1  # the STFT reflects n_fft/2 samples at each end
    needed = -(-least * sample_rate // encoder.sample_rate)
    if resampled_length(waveform.shape[2], sample_rate, encoder.sample_rate) < least:
        raise LTX25Error(where, "the audio length", f"{waveform.shape[2]} samples at {sample_rate} Hz",
                         f"at least {needed} samples ({least / encoder.sample_rate * 1000:.0f} ms)",
                         "An empty or near-empty clip has nothing to encode.")
    return waveform.expand(-1, channels, -1) if waveform.shape[1] == 1 else waveform


def working_memory(encoder: AudioEncoder, waveform_shape: tuple[int, ...], sample_rate: int) -> int:
    """Bytes an encode of `[B, C, N]` at `sample_rate` needs beyond the weights, per batch item: ~16 live fp32 maps
    of the first stage (`ch` channels × mel bins per mel frame), the complex spectrum of both channels, the
    resampled waveform — about 50 MiB per second of audio at the shipped width."""
    samples = resampled_length(waveform_shape[-1], sample_rate, encoder.sample_rate)
    frames = mel_frames(samples, encoder.config.mel_hop_length)
    maps = 16 * encoder.config.ch * encoder.config.mel_bins * frames * 4
    spectrum = 2 * frames * (encoder.n_fft // 2 + 1) * 8
    return int(waveform_shape[0] * (maps + spectrum + 2 * 4 * samples))


def encode_audio(encoder: AudioEncoder, waveform: torch.Tensor, sample_rate: int, where: str = "encode_audio",
                 check: Callable[[], None] | None = None) -> torch.Tensor:
    """Waveform `[B, C, N]` at `sample_rate` → NORMALIZED audio latent `[B, 8, T, 16]` float32 on the CPU, with
    T = `latent_frames_for_samples(N)` (25 per second): resampled to the encoder's rate, log-mel `[B, C, M, 64]` in
    float32 (`mel.log_mel`), encoded in the weights' dtype, the means kept, `(means − mean) / std` per (channel,
    bin). What `decode_audio` un-normalizes. `check()` runs before each encoder block (it raises to interrupt)."""
    waveform = check_waveform(waveform, sample_rate, encoder, f"{where}.audio")
    sample_rate = int(sample_rate)
    param = next(encoder.encoder.parameters())
    # the stages and the mid block are containers diffusers never calls: hook the blocks it does call
    blocks = [*(block for stage in encoder.encoder.down for block in stage.block),
              encoder.encoder.mid.block_1, encoder.encoder.mid.block_2] if check is not None else []
    with torch.inference_mode(), checked_before(blocks, check), float32_convolutions(param.device):
        audio = resample(waveform.to(param.device, torch.float32), sample_rate, encoder.sample_rate)
        mel = log_mel(audio, encoder.sample_rate, encoder.n_fft, encoder.config.mel_hop_length,
                      encoder.config.mel_bins)                                               # [B, C, M, 64]
        means = encoder.encoder(mel.to(param.dtype))[:, :LATENT_CHANNELS].float()          # [B, 8, T, 16]
        shape = (1, LATENT_CHANNELS, 1, LATENT_BINS)  # statistics are (channel, bin)-major: index c·16 + f
        latent = (means - encoder.latents_mean.float().view(shape)) / encoder.latents_std.float().view(shape)
    return latent.cpu()
