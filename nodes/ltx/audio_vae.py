"""The LTX-2.5 audio decoder (docs/MODEL.md §11, §12): diffusers' `LTX2AudioDecoder` (latent → stereo mel) and
`LTX2VocoderWithBWE` (mel → 16 kHz waveform → bandwidth extension to 48 kHz), configured from the file's
`config.audio_vae` and `config.vocoder`, loaded strictly from `audio_vae.*` / `vocoder.*`.

The file's `audio_vae.encoder.*` is on the drop list here (the encoder is loaded on its own, by
`nodes/ltx/encode/audio_encoder.py`). The vocoder always runs in float32: bf16 accumulation through its ~100
sequential convolutions degrades the spectrum (the reference autocasts to fp32).

Lengths: a latent of T frames becomes 4T−3 mel frames (the causal decoder trims 3), 160 samples each at 16 kHz,
×3 at 48 kHz: 480·(4T−3) samples. The sampler makes T = round(F/fps·25) for F video frames, so the audio is
10–50 ms shorter than the video by construction; `decode_audio` warns only beyond that.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR, LTX2AudioDecoder
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE, UpSample1d

from .files.assets import Kind, expect_kind, read_state_dict
from .files.config import config_field
from .errors import LTX25Error
from .files.keymap import Drop, KeyMap, Rename, load_strict
from .files.vae_layout import statistics_renames, unused_statistics
from .cpu_convolutions import float32_convolutions
from .stop_points import checked_before
from .geometry import (AUDIO_BINS, AUDIO_CHANNELS, AUDIO_LATENTS_PER_SECOND, TEMPORAL_COMPRESSION,
                       audio_latent_frames, pixel_frames)

log = logging.getLogger("ltx25")
LATENT_CHANNELS, LATENT_BINS = AUDIO_CHANNELS, AUDIO_BINS

# Vocoder renames are anchored per generator: `conv_in`/`conv_out` are also audio-decoder names, so an unanchored
# `conv_pre → conv_in` row would turn the decoder's keys into vocoder names when the writer runs the map backwards.
_VOCODER_RENAMES = (("ups", "upsamplers"), ("resblocks", "resnets"), ("conv_pre", "conv_in"),
                    ("conv_post", "conv_out"), ("act_post", "act_out"))
KEY_MAP = KeyMap(
    "audio VAE decoder + vocoder",
    renames=(
        Rename("audio_vae.decoder", "decoder"),
        *statistics_renames("audio_vae."),
        *(Rename(f"vocoder.{part}.{native}", f"vocoder.{part}.{module}")
          for part in ("vocoder", "bwe_generator") for native, module in _VOCODER_RENAMES),
        # Anti-alias activations: native `downsample.lowpass.filter`, diffusers `downsample.filter`.
        Rename("downsample.lowpass", "downsample", anywhere=True),
    ),
    drops=(
        Drop(r"audio_vae\.encoder\..*", "the audio encoder: LTX-2.5 Load Audio Encoder builds it (encode/)"),
        unused_statistics("audio_vae.", "dataset statistics the decoder does not use"),
    ),
)


_STRIPPED = "The file's metadata was stripped or is from an older LTX release."


@dataclass(frozen=True)
class AudioVAEConfig:
    """`config.audio_vae` (native names: `model.params.ddconfig`, `preprocessing.stft`). Defaults are the
    reference builder's; `LTX2AudioDecoder`'s own defaults differ (group norm, width causality, mono)."""
    ch: int
    out_ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    resolution: int
    z_channels: int
    mel_bins: int
    in_channels: int
    double_z: bool
    dropout: float
    sample_rate: int
    mel_hop_length: int
    is_causal: bool

    @classmethod
    def from_metadata(cls, where: str, metadata: Mapping[str, Any]) -> "AudioVAEConfig":
        field = lambda path, *a, **k: config_field(where, metadata, f"audio_vae.{path}", *a, **k)  # noqa: E731
        dd = lambda key, *a, **k: field(f"model.params.ddconfig.{key}", *a, **k)  # noqa: E731
        field("model.params.ddconfig", kind=Mapping, hint=_STRIPPED)
        fixed = {"norm_type": ("pixel", "pixel"), "causality_axis": ("height", "height"),
                 "mid_block_add_attention": (True, False), "attn_resolutions": ([8, 16, 32], []),
                 "z_channels": (8, LATENT_CHANNELS), "mel_bins": (None, 64), "out_ch": (2, 2)}
        mel_channels = field("preprocessing.mel.n_mel_channels", None)
        for key, (default, wanted) in fixed.items():
            # like the reference, a ddconfig without mel_bins takes the preprocessing's n_mel_channels
            dd(key, mel_channels if key == "mel_bins" else default, allowed=(wanted,),
               hint="LTX-2.5 audio VAE files ship this value; the file is from another model.")
        made = cls(ch=int(dd("ch", 128)), out_ch=2, ch_mult=tuple(dd("ch_mult", (1, 2, 4))),
                   num_res_blocks=int(dd("num_res_blocks", 2)), resolution=int(dd("resolution", 256)),
                   z_channels=LATENT_CHANNELS, mel_bins=64, in_channels=int(dd("in_channels", 2)),
                   double_z=bool(dd("double_z", True)), dropout=float(dd("dropout", 0.0)),
                   sample_rate=int(field("model.params.sampling_rate", 16000)),
                   mel_hop_length=int(field("preprocessing.stft.hop_length", 160)),
                   is_causal=bool(field("preprocessing.stft.causal", True)))
        if made.mel_bins // 2 ** (len(made.ch_mult) - 1) != LATENT_BINS:
            raise LTX25Error(where, "config.audio_vae…ddconfig.ch_mult", list(made.ch_mult),
                             f"{LATENT_DOWNSAMPLE_FACTOR}× mel downsampling (3 levels) so 64 mel bins give "
                             f"{LATENT_BINS} latent bins")
        return made

    def module_kwargs(self) -> dict[str, Any]:
        """`LTX2AudioDecoder`/`LTX2AudioEncoder` arguments, every one passed."""
        return dict(base_channels=self.ch, output_channels=self.out_ch, num_res_blocks=self.num_res_blocks,
                    attn_resolutions=None, in_channels=self.in_channels, resolution=self.resolution,
                    latent_channels=self.z_channels, ch_mult=self.ch_mult, norm_type="pixel",
                    causality_axis="height", dropout=self.dropout, mid_block_add_attention=False,
                    sample_rate=self.sample_rate, mel_hop_length=self.mel_hop_length, is_causal=self.is_causal,
                    mel_bins=self.mel_bins)


def _generator_kwargs(where: str, cfg: Mapping[str, Any], prefix: str, stage: str, final: bool) -> dict[str, Any]:
    """One native BigVGAN-v2 generator config → `LTX2Vocoder` arguments (prefixed `bwe_` for the second one).

    `final`: the reference applies a final activation to the first stage (clamp to [−1, 1], as use_tanh_at_final
    is false) and never to the BWE generator, whatever their configs say; diffusers' converter sets None for both."""
    for key, wanted in (("resblock", "AMP1"), ("activation", "snakebeta"), ("stereo", True)):
        if cfg.get(key) != wanted:
            raise LTX25Error(where, f"config.vocoder.{stage}.{key}", cfg.get(key), repr(wanted),
                             "LTX-2.5 ships a BigVGAN-v2 (AMP1, snakebeta) stereo vocoder.")
    final_act = ("tanh" if cfg.get("use_tanh_at_final", True) else "clamp") if final else None
    kwargs = dict(in_channels=128, hidden_channels=int(cfg["upsample_initial_channel"]), out_channels=2,
                  upsample_kernel_sizes=list(cfg["upsample_kernel_sizes"]),
                  upsample_factors=list(cfg["upsample_rates"]),
                  resnet_kernel_sizes=list(cfg["resblock_kernel_sizes"]),
                  resnet_dilations=[list(d) for d in cfg["resblock_dilation_sizes"]], act_fn="snakebeta",
                  leaky_relu_negative_slope=0.1, antialias=True, antialias_ratio=2, antialias_kernel_size=12,
                  final_act_fn=final_act, final_bias=bool(cfg.get("use_bias_at_final", True)))
    return {f"{prefix}{k}": v for k, v in kwargs.items()}


def vocoder_kwargs(where: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`config.vocoder` = {"vocoder": stage 1 (mel → 16 kHz), "bwe": stage 2 + STFT/rates} → `LTX2VocoderWithBWE`."""
    config_field(where, metadata, "vocoder", kind=Mapping, hint=_STRIPPED)
    if config_field(where, metadata, "vocoder.bwe", None) is None:
        raise LTX25Error(where, "config.vocoder", "a single vocoder (LTX-2.0 layout)", "vocoder + bwe (LTX-2.3/2.5)",
                         "This pack runs the LTX-2.5 audio VAE file.")
    stage1, bwe = (config_field(where, metadata, f"vocoder.{part}", kind=Mapping, hint=_STRIPPED)
                   for part in ("vocoder", "bwe"))
    # The reference builds the mel STFT with win_length = n_fft (its `win_size` field is not read).
    return {**_generator_kwargs(where, stage1, "", "vocoder", True),
            **_generator_kwargs(where, bwe, "bwe_", "bwe", False),
            "filter_length": int(bwe["n_fft"]), "hop_length": int(bwe["hop_length"]),
            "window_length": int(bwe["n_fft"]), "num_mel_channels": int(bwe["num_mels"]),
            "input_sampling_rate": int(bwe["input_sampling_rate"]),
            "output_sampling_rate": int(bwe["output_sampling_rate"])}


class AudioVAE(torch.nn.Module):
    """LTX25_AUDIO_VAE: `decoder` (latent `[B, 8, T, 16]` → mel `[B, 2, 4T−3, 64]`), `vocoder` (mel → waveform
    `[B, 2, S]` at `sample_rate`, float32) and the per-(channel, bin) statistics `latents_mean`/`latents_std` `[128]`.

    The statistics are our buffers, not `AutoencoderKLLTX2Audio`'s: that class sizes them by `base_channels`, which
    equals 8·16 only at the shipped width."""

    def __init__(self, config: AudioVAEConfig, vocoder: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.decoder = LTX2AudioDecoder(**config.module_kwargs())
        self.vocoder = LTX2VocoderWithBWE(**vocoder)
        self.register_buffer("latents_mean", torch.zeros(LATENT_CHANNELS * LATENT_BINS))
        self.register_buffer("latents_std", torch.ones(LATENT_CHANNELS * LATENT_BINS))

    @property
    def sample_rate(self) -> int:
        return int(self.vocoder.config.output_sampling_rate)

    def samples_per_mel_frame(self) -> int:
        """Output samples per mel frame (480 at 48 kHz: hop 160 at 16 kHz, ×3)."""
        return self.config.mel_hop_length * self.sample_rate // self.config.sample_rate


def working_memory(vae: AudioVAE, latent_shape: tuple[int, ...]) -> int:
    """Bytes a decode of `[B, 8, T, 16]` needs beyond the weights: ~256 MiB per second of fp32 vocoder activations
    (BWE at 48 kHz dominates)."""
    return int(latent_shape[0] * latent_shape[2] / AUDIO_LATENTS_PER_SECOND * 256 * 2**20)


def _finish_vocoder(vae: AudioVAE) -> None:
    """After loading: re-create the resampler's sinc filter (non-persistent, so it stayed on meta) and move the
    whole vocoder to float32 whatever the weight dtype."""
    rate = vae.vocoder.config
    vae.vocoder.resampler = UpSample1d(ratio=rate.output_sampling_rate // rate.input_sampling_rate,
                                       window_type="hann", persistent=False)
    vae.vocoder.float()


def load_audio_vae(path: str, dtype: torch.dtype | None = None) -> AudioVAE:
    """Native audio VAE file → `AudioVAE` (eval, no grad): decoder in `dtype`, vocoder always float32."""
    info = expect_kind(path, Kind.AUDIO_VAE)
    config = AudioVAEConfig.from_metadata(info.path, info.header.metadata)
    vocoder = vocoder_kwargs(info.path, info.header.metadata)
    return load_strict(info.path, lambda: AudioVAE(config, vocoder), read_state_dict(info.path), KEY_MAP, dtype,
                       init_buffers=_finish_vocoder)


# ------------------------------------------------------------------------------------------------------ decode
@contextlib.contextmanager
def cudnn_heuristics() -> Iterator[None]:
    """cuDNN picks each convolution's algorithm by its heuristics inside, whatever `torch.backends.cudnn.benchmark`
    says outside (ComfyUI's `--fast autotune` and many scripts turn it on; the A/B graph bench does). At the released
    widths a 121-frame clip runs 149 distinct convolution shapes through the decoder and vocoder (643 calls: 3 kernel
    sizes × 3 dilations at each of 6 + 5 upsampling widths, the anti-aliasing filters, the upsamplers), almost all
    fp32 1-D on long signals. With benchmarking on, each shape's first use times every algorithm cuDNN has for it:
    the first audio decode of a process took 8.2 s against 0.08 s warm (H200), and a new clip length pays again.
    `bench/bench_cold_start.py` measures the first decode both ways. The flag is global: another thread's
    convolutions in this window also go by heuristics, which can only cost them speed."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def check_audio_latent(samples: object, where: str) -> torch.Tensor:
    """An LTX-2.5 audio latent `[B, 8, T, 16]`, or an error naming `where` (a node input)."""
    shape = list(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
    if not isinstance(samples, torch.Tensor) or samples.ndim != 4 or samples.shape[1] != LATENT_CHANNELS \
            or samples.shape[3] != LATENT_BINS:
        raise LTX25Error(where, "the audio latent shape", shape, f"[B, {LATENT_CHANNELS}, T, {LATENT_BINS}]",
                         "A video latent [B, 128, F', H', W'] goes to a video decode node." if
                         isinstance(samples, torch.Tensor) and samples.ndim == 5 else
                         "Connect the audio LATENT of an LTX-2.5 sampler or Empty Latent.")
    if samples.shape[0] == 0 or samples.shape[2] == 0:
        raise LTX25Error(where, "the audio latent shape", shape, f"[B ≥ 1, {LATENT_CHANNELS}, T ≥ 1, {LATENT_BINS}]",
                         "An empty latent decodes to nothing: check the node that made it.")
    return samples


def video_frames_for(latent_frames: int, fps: float) -> int | None:
    """The 8k+1 video frame count F whose audio latent has `latent_frames` = round(F/fps·25) frames, or None."""
    k = max(0, round((latent_frames * fps / AUDIO_LATENTS_PER_SECOND - 1) / TEMPORAL_COMPRESSION))
    for frames in (pixel_frames(k + 1), pixel_frames(k), pixel_frames(k + 2)):
        if frames >= 1 and audio_latent_frames(frames, fps) == latent_frames:
            return frames
    return None


def length_drift(samples: int, frames: int, fps: float, sample_rate: int, mel_frame: int) -> int:
    """Output samples minus what the video lasts, after the decoder's expected 3-mel-frame causal trim."""
    return samples - round(frames / fps * sample_rate) + (LATENT_DOWNSAMPLE_FACTOR - 1) * mel_frame


def decode_audio(vae: AudioVAE, latent: torch.Tensor, fps: float | None = None, frames: int | None = None,
                 where: str = "decode_audio", check: Callable[[], None] | None = None) -> dict:
    """Normalized audio latent `[B, 8, T, 16]` → AUDIO `{"waveform": [B, 2, 480·(4T−3)] float32 CPU, "sample_rate":
    48000}`. With `fps` (and `frames`, else inferred from T), warns when the audio length drifts from the video's
    by more than one latent frame (1920 samples) beyond the expected trim — a sign of mismatched clips or fps.
    `check()` runs before each decoder and vocoder block (it raises to interrupt)."""
    check_audio_latent(latent, f"{where}.latent")
    param = next(vae.decoder.parameters())
    blocks = [vae.decoder.mid, *vae.decoder.up, *(stage for vocoder in (vae.vocoder.vocoder, vae.vocoder.bwe_generator)
                                                 for stage in vocoder.upsamplers)]
    with torch.inference_mode(), checked_before(blocks, check), cudnn_heuristics(), \
            float32_convolutions(param.device):
        shape = (1, LATENT_CHANNELS, 1, LATENT_BINS)     # statistics are (channel, bin)-major: index c·16 + f
        mean = vae.latents_mean.to(param.device, torch.float32).view(shape)
        std = vae.latents_std.to(param.device, torch.float32).view(shape)
        z = latent.to(param.device, torch.float32) * std + mean
        mel = vae.decoder(z.to(param.dtype))                 # [B, 2, 4T−3, 64]
        waveform = vae.vocoder(mel.float())                  # [B, 2, S], float32 (see _finish_vocoder)
    out = {"waveform": waveform.float().cpu(), "sample_rate": vae.sample_rate}
    if fps:
        frames = frames or video_frames_for(latent.shape[2], fps)
        if frames is None:
            log.warning("%s: an audio latent of %d frames matches no 8k+1 video frame count at %s fps; the audio "
                        "will not line up with the video.", where, latent.shape[2], fps)
        else:
            drift = length_drift(waveform.shape[-1], frames, fps, vae.sample_rate, vae.samples_per_mel_frame())
            if abs(drift) > LATENT_DOWNSAMPLE_FACTOR * vae.samples_per_mel_frame():
                log.warning("%s: the audio lasts %.3f s but %d frames at %s fps last %.3f s (drift %+d samples): the "
                            "audio latent belongs to another clip or frame rate.", where,
                            waveform.shape[-1] / vae.sample_rate, frames, fps, frames / fps, drift)
    return out
