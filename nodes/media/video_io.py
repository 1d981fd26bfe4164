"""MP4 files from IMAGE frames: the checks before `mp4_encoder` encodes them (H.264 + AAC + JSON run metadata),
numbered output names that never overwrite, and a probe that reads a file back.

The audio is fitted to the video's duration (silence appended, or the tail cut) so both streams end
together — the LTX audio VAE yields 10–50 ms less than F/fps by construction (docs/MODEL.md §11; see audio_vae).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

import av
import numpy as np
import torch

from ..ltx.errors import LTX25Error
from .mp4_encoder import encode_mp4

COUNTER_DIGITS = 5


def output_path(directory: str, prefix: str, ext: str = "mp4") -> tuple[str, str, str]:
    """(path, subfolder, filename) of the next `prefix_00001_.mp4`-style file, ComfyUI's naming.

    `prefix` may hold subfolders ("videos/LTX25"); it must stay inside `directory`. The counter follows the
    highest existing one, and the file is created exclusively before returning, so two saves — even racing
    ones — never get the same name and nothing is overwritten."""
    root = os.path.abspath(directory)
    target = os.path.abspath(os.path.join(root, os.path.normpath(prefix or "LTX25")))
    if os.path.commonpath([root, target]) != root or target == root:
        raise LTX25Error("filename_prefix", "the filename prefix", repr(prefix), f"a name inside {root}",
                         "Remove '..' and absolute paths from the prefix.")
    folder, base = os.path.split(target)
    os.makedirs(folder, exist_ok=True)
    pattern = re.compile(rf"^{re.escape(base)}_(\d{{{COUNTER_DIGITS},}})_\.{re.escape(ext)}$")
    counter = max((int(m.group(1)) for m in map(pattern.match, os.listdir(folder)) if m), default=0) + 1
    while True:
        filename = f"{base}_{counter:0{COUNTER_DIGITS}d}_.{ext}"
        path = os.path.join(folder, filename)
        try:
            with open(path, "xb"):
                pass
            subfolder = os.path.relpath(folder, root)
            return path, "" if subfolder == "." else subfolder.replace(os.sep, "/"), filename
        except FileExistsError:
            counter += 1


def fit_audio(waveform: torch.Tensor, samples: int) -> torch.Tensor:
    """`[C, S]` → `[C, samples]`: silence appended or the tail cut."""
    if waveform.shape[-1] >= samples:
        return waveform[..., :samples]
    return torch.nn.functional.pad(waveform, (0, samples - waveform.shape[-1]))


def host_float32(frames: torch.Tensor) -> np.ndarray:
    """The frames as a float32 numpy array in host memory (no copy when they already are)."""
    with torch.inference_mode(frames.is_inference()):  # a worker thread: inference mode is per thread
        return frames.detach().to("cpu", torch.float32).contiguous().numpy()


@dataclass(frozen=True)
class Mp4Job:
    """A checked save: what `mp4_encoder.encode_mp4` takes, less the frames."""
    rate: Fraction
    audio: np.ndarray | None           # [C, S] float32, the video's length
    sample_rate: int
    metadata: dict[str, str]
    crf: int
    segments: int | None

    def arguments(self, path: str) -> dict:
        return {"path": path, "rate": self.rate, "audio": self.audio, "sample_rate": self.sample_rate,
                "metadata": self.metadata, "crf": self.crf, "segments": self.segments}


def mp4_job(frames: torch.Tensor, fps: float, audio: torch.Tensor | None = None, sample_rate: int = 48000,
            metadata: Mapping[str, str] | None = None, crf: int = 17, segments: int | None = None) -> Mp4Job:
    """Checks a save's inputs: frames `[F, H, W, 3]`, audio `[C, S]` (C = 1 or 2, fitted to F/fps seconds)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise LTX25Error("images", "the image batch shape", list(frames.shape), "[F, H, W, 3] with F ≥ 1")
    if not fps > 0:
        raise LTX25Error("fps", "fps", fps, "a frame rate > 0")
    rate = Fraction(fps).limit_denominator(1001)
    samples = None
    if audio is not None:
        if audio.ndim != 2 or audio.shape[0] not in (1, 2):
            raise LTX25Error("audio", "the waveform shape", list(audio.shape), "[C, S] with C = 1 or 2")
        seconds = frames.shape[0] / float(rate)
        samples = np.ascontiguousarray(fit_audio(audio.float().cpu(), round(seconds * sample_rate)).numpy())
    return Mp4Job(rate, samples, sample_rate, dict(metadata or {}), crf, segments)


def write_mp4(path: str, frames: torch.Tensor, fps: float, audio: torch.Tensor | None = None,
              sample_rate: int = 48000, metadata: Mapping[str, str] | None = None, crf: int = 17,
              segments: int | None = None) -> str:
    """Frames `[F, H, W, 3]` float in [0, 1] (+ optional audio `[C, S]` float in [−1, 1], C = 1 or 2) →
    H.264/AAC mp4, in this process (`encoder_process.write_mp4` encodes in a helper process). `metadata` values are
    stored as container tags; the audio is fitted to F/fps seconds; see `mp4_encoder.encode_mp4` for `segments`."""
    return write_job(path, frames, mp4_job(frames, fps, audio, sample_rate, metadata, crf, segments))


def write_job(path: str, frames: torch.Tensor, job: Mp4Job) -> str:
    """A checked save (`mp4_job`) encoded in this process."""
    encode_mp4(frames=host_float32(frames), **job.arguments(path))
    return path


@dataclass(frozen=True)
class Mp4Info:
    frames: int
    fps: float
    width: int
    height: int
    audio_samples: int = 0          # decoded samples per channel (AAC pads to whole 1024-sample frames)
    sample_rate: int = 0
    audio_channels: int = 0
    metadata: dict = field(default_factory=dict)

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate if self.sample_rate else 0.0


def probe_mp4(path: str, decode: bool = True) -> Mp4Info:
    """Read an mp4 back: frame count (decoded when `decode`, else from the header), fps, size, audio, tags."""
    with av.open(path) as container:
        video = container.streams.video[0]
        fps = float(video.average_rate or video.guessed_rate)
        width, height = video.codec_context.width, video.codec_context.height
        frames = sum(1 for _ in container.decode(video=0)) if decode else video.frames
        metadata = dict(container.metadata)
    audio_samples = sample_rate = channels = 0
    with av.open(path) as container:
        if container.streams.audio:
            stream = container.streams.audio[0]
            sample_rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
            audio_samples = sum(frame.samples for frame in container.decode(audio=0))
    return Mp4Info(frames, fps, width, height, audio_samples, sample_rate, channels, metadata)


def run_metadata(text: str) -> dict[str, str]:
    """The `metadata` input as container tags: JSON objects are stored compactly under "comment", anything else
    as typed."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        return {"comment": json.dumps(json.loads(text), separators=(",", ":"))}
    except json.JSONDecodeError:
        return {"comment": text}
