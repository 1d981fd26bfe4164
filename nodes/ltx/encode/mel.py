"""The audio encoder's input (docs/MODEL.md §17.3): a waveform resampled to the model's rate, then a log-mel
spectrogram, both exactly as the reference computes them with torchaudio — re-expressed here in torch, since the pack
does not depend on torchaudio (the mel filter bank comes from transformers, whose slaney bank is torchaudio's).

- Resampling: torchaudio's `resample` defaults, a Hann-windowed sinc interpolator (6 zero crossings, roll-off 0.99)
  over the rates reduced by their gcd, one polyphase filter per output phase, applied as a strided convolution.
- Mel: `MelSpectrogram(n_fft, win_length = n_fft, hop, f_min 0, f_max = rate / 2, n_mels, Hann window, center with
  reflect padding, power 1 — the magnitude, slaney mel scale and slaney area normalization)`, then
  `log(max(mel, 1e-5))`, laid out `[B, C, frames, n_mels]`. The file's `preprocessing.mel.mel_fmin/mel_fmax` and
  `win_length` fields are not read by the reference either.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from transformers.audio_utils import mel_filter_bank

ZERO_CROSSINGS = 6       # torchaudio's `lowpass_filter_width`
ROLLOFF = 0.99           # torchaudio's `rolloff`: the cut-off, as a fraction of the lower Nyquist frequency
LOG_FLOOR = 1e-5         # mel magnitudes are clamped here before the log


@lru_cache(maxsize=16)
def _sinc_filters(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """(filters `[new, 1, 2·width + orig]` float32, width) for rates already divided by their gcd: output phase j
    of every block of `new` samples weighs the input around `j·orig/new` with a Hann-windowed sinc cut at
    `ROLLOFF·min(orig, new)`. Built in float64 (torchaudio builds it in the waveform's dtype: the same filter to
    float32 rounding)."""
    cutoff = min(orig, new) * ROLLOFF
    width = math.ceil(ZERO_CROSSINGS * orig / cutoff)
    taps = torch.arange(-width, width + orig, dtype=torch.float64) / orig                  # input offsets, seconds·orig
    t = (taps.view(1, -1) - torch.arange(new, dtype=torch.float64).view(-1, 1) / new) * cutoff
    t = t.clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = torch.cos(t * (math.pi / ZERO_CROSSINGS / 2)) ** 2
    phase = t * math.pi
    sinc = torch.where(phase == 0, torch.ones_like(phase), torch.sin(phase) / phase)
    return (sinc * window * (cutoff / orig)).float().unsqueeze(1), width


def resample(waveform: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """`[..., N]` float at `orig_rate` → `[..., ceil(N·new/orig)]` at `new_rate` (the input unchanged when the rates
    agree), as torchaudio's `functional.resample` with its defaults."""
    if orig_rate == new_rate:
        return waveform
    gcd = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // gcd, int(new_rate) // gcd
    filters, width = _sinc_filters(orig, new)
    shape, length = waveform.shape[:-1], waveform.shape[-1]
    flat = torch.nn.functional.pad(waveform.reshape(-1, 1, length), (width, width + orig))
    out = torch.nn.functional.conv1d(flat, filters.to(waveform.device, waveform.dtype), stride=orig)  # [n, new, k]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[:, :math.ceil(new * length / orig)]
    return out.reshape(*shape, -1)


@lru_cache(maxsize=8)
def _mel_bank(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """`[n_fft/2 + 1, n_mels]` float32: triangular filters evenly spaced on the slaney mel scale from 0 to
    `sample_rate / 2`, each scaled to unit area (slaney norm)."""
    bank = mel_filter_bank(n_fft // 2 + 1, n_mels, 0.0, sample_rate / 2.0, sample_rate, norm="slaney",
                           mel_scale="slaney")
    return torch.from_numpy(bank).float()


def mel_frames(samples: int, hop_length: int) -> int:
    """Mel frames of `samples` samples: one per hop, plus one (the STFT is centred)."""
    return samples // hop_length + 1


def log_mel(waveform: torch.Tensor, sample_rate: int, n_fft: int, hop_length: int, n_mels: int) -> torch.Tensor:
    """`[B, C, N]` float at `sample_rate` → log-mel `[B, C, N // hop + 1, n_mels]` float32 (N must exceed
    n_fft / 2: the centred STFT reflects that many samples at each end)."""
    batch, channels, length = waveform.shape
    x = waveform.reshape(batch * channels, length).float()
    window = torch.hann_window(n_fft, periodic=True, dtype=torch.float32, device=x.device)
    spectrum = torch.stft(x, n_fft, hop_length, n_fft, window, center=True, pad_mode="reflect", normalized=False,
                          onesided=True, return_complex=True).abs()                        # [BC, n_fft/2+1, frames]
    mel = spectrum.transpose(1, 2) @ _mel_bank(n_fft, n_mels, sample_rate).to(x.device)     # [BC, frames, n_mels]
    return mel.clamp(min=LOG_FLOOR).log().reshape(batch, channels, -1, n_mels)
