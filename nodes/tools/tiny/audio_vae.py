"""The tiny audio VAE + vocoder file in the native format (`audio_vae.{encoder,decoder,per_channel_statistics}.*`,
`vocoder.{vocoder,bwe_generator,mel_stft}.*`; `config.audio_vae`, `config.vocoder`) with z_channels 8, 64 mel bins
and the real hops, so latents are `[B, 8, T, 16]` and the output is 48 kHz of the real length."""
from __future__ import annotations

import torch

from ...ltx.audio_vae import KEY_MAP, LATENT_BINS, LATENT_CHANNELS, AudioVAE, AudioVAEConfig, vocoder_kwargs
from ...ltx.encode.audio_encoder import KEY_MAP as ENCODER_KEY_MAP, AudioEncoder, encoder_settings
from ...ltx.release import MODEL_VERSION
from .common import generator, randomize_, save_native

# `ch` is also the length of the per-channel statistics in the reference (its PerChannelStatistics is built with
# `ch` channels), and they hold one value per (latent channel, mel bin): 8 × 16 = 128, as in the released file. The
# tiny widths come from `ch_mult` (1, 1, 1): three levels (64 mel bins → 16 latent bins) at width 128.
TINY_AUDIO_VAE_CONFIG = {
    "model": {"params": {"ddconfig": {
        "double_z": True, "mel_bins": 64, "z_channels": LATENT_CHANNELS, "resolution": 256, "downsample_time": False,
        "in_channels": 2, "out_ch": 2, "ch": LATENT_CHANNELS * LATENT_BINS, "ch_mult": [1, 1, 1], "num_res_blocks": 1,
        "attn_resolutions": [], "dropout": 0.0, "mid_block_add_attention": False, "norm_type": "pixel",
        "causality_axis": "height"},
        "sampling_rate": 16000}},
    "preprocessing": {"audio": {"sampling_rate": 16000, "max_wav_value": 32768.0, "duration": 5.12, "stereo": True,
                                "causal_padding": 3},
                      "stft": {"filter_length": 1024, "hop_length": 160, "win_length": 1024, "causal": True},
                      "mel": {"n_mel_channels": 64, "mel_fmin": 0, "mel_fmax": 8000}},
}
_TINY_GENERATOR = {"resblock": "AMP1", "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]],
                   "stereo": True, "use_tanh_at_final": False, "activation": "snakebeta", "use_bias_at_final": False}
# Real rates and kernels (16 kHz × 160 per mel frame, then ×3 to 48 kHz); tiny widths and resblocks.
TINY_VOCODER_CONFIG = {
    "vocoder": {**_TINY_GENERATOR, "upsample_initial_channel": 64, "upsample_rates": [5, 2, 2, 2, 2, 2],
                "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4]},
    "bwe": {**_TINY_GENERATOR, "upsample_initial_channel": 32, "upsample_rates": [6, 5, 2, 2, 2],
            "upsample_kernel_sizes": [12, 11, 4, 4, 4], "apply_final_activation": False, "input_sampling_rate": 16000,
            "output_sampling_rate": 48000, "hop_length": 80, "n_fft": 512, "win_size": 512, "num_mels": 64},
}


def _audible_(module: torch.nn.Module) -> torch.nn.Module:
    """Rescale 1-D (transposed) conv weights to half gain, std 0.5/√(C_in·k/stride), so the random tiny vocoder makes
    an audible waveform that stays below clipping, instead of randomize_'s near-silence or unit gain's clipping."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                fan_in = m.in_channels * m.kernel_size[0] / m.stride[0]
                m.weight.mul_(0.5 / (m.weight.std() * fan_in ** 0.5))
    return module


def write_tiny(path: str, seed: int = 0) -> str:
    """The tiny audio VAE file, written to `path`."""
    metadata = {"config": {"audio_vae": TINY_AUDIO_VAE_CONFIG, "vocoder": TINY_VOCODER_CONFIG},
                "model_version": MODEL_VERSION}
    config = AudioVAEConfig.from_metadata(path, metadata)
    fresh = AudioVAE(config, vocoder_kwargs(path, metadata))
    vae = randomize_(AudioVAE(config, vocoder_kwargs(path, metadata)), seed, "audio_vae")
    _audible_(vae.vocoder)
    state = vae.state_dict()
    for name, tensor in fresh.state_dict().items():
        if name.endswith(".filter"):          # the anti-alias sinc filters are constants, not weights
            state[name] = tensor
    state["vocoder.mel_stft.mel_basis"] = state["vocoder.mel_stft.mel_basis"].abs()   # a non-negative filterbank
    g = generator(seed, "audio_statistics")
    state["latents_mean"] = torch.randn(LATENT_CHANNELS * LATENT_BINS, generator=g) * 0.1
    state["latents_std"] = torch.rand(LATENT_CHANNELS * LATENT_BINS, generator=g) * 0.5 + 0.75
    encoder = randomize_(AudioEncoder(*encoder_settings(path, metadata)).encoder, seed, "audio_vae_encoder")
    tensors = KEY_MAP.to_native(state)
    tensors |= ENCODER_KEY_MAP.to_native({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
    return save_native(path, tensors, metadata)
