"""MP4 files through PyAV: H.264 (libx264, yuv420p) video with optional AAC audio and JSON run metadata, numbered
output names that never overwrite, and a probe that reads a file back (tests, the compare report).

yuv420p stores colour at half resolution, so width and height must be even: odd frames get their last row/column
repeated. The audio is fitted to the video's duration (silence appended, or the tail cut) so both streams end
together — the LTX audio VAE yields 10–50 ms less than F/fps by construction (ltx25.md §11; see audio_vae).
"""
from __future__ import annotations

import json
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterator, Mapping

import av
import numpy as np
import torch

from .errors import LTX25Error

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


def _even(frame: torch.Tensor) -> torch.Tensor:
    """`[H, W, 3]` with the last row/column repeated where H or W is odd (yuv420p needs even sizes)."""
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    if pad_h or pad_w:
        frame = torch.nn.functional.pad(frame.permute(2, 0, 1)[None], (0, pad_w, 0, pad_h), mode="replicate")[0]
        frame = frame.permute(1, 2, 0)
    return frame


def _rgb24(frame: torch.Tensor) -> np.ndarray:
    """`[H, W, 3]` float in [0, 1] → uint8 `[H', W', 3]` (even sizes), rounded to nearest. One scaled copy converted
    in place: a temporary per operation made the conversion cost as much as the encode (2.0 s for 121 frames at
    768×512 on 2 cores, now 0.15 s: fresh multi-MB buffers come from mmap and page-fault on first write)."""
    scaled = _even(frame).to("cpu", torch.float32).mul(255)
    return scaled.clamp_(0, 255).round_().to(torch.uint8).numpy()


CONVERT_AHEAD = 4  # frames converted ahead of the encoder (each a few MB)


def _picture(frame: torch.Tensor, index: int) -> av.VideoFrame:
    with torch.inference_mode(frame.is_inference()):  # a worker thread: inference mode is per thread
        picture = av.VideoFrame.from_ndarray(_rgb24(frame), format="rgb24").reformat(format="yuv420p")
    picture.pts = index
    return picture


# x264's "veryfast" at crf 17: measured (bench notes in docs/PERFORMANCE.md) 3× faster than the default "medium" on
# noise-like frames (2.1 vs 6.5 s for 121 frames at 768×512, 2 cores) and 1.3× on smooth ones; the crf keeps the
# quality, the files grow a little.
X264_PRESET = "veryfast"
# x264's frame threads: with the frames converted on a helper thread, 0.55 vs 0.86 s for 121 noise frames at
# 768×512 with slice threads (16 cores, bench/bench_save_video.py); before that, the serial conversion starved them
_THREAD_TYPE = "FRAME"


def _encoded(encode, frames: torch.Tensor, start: int, stop: int) -> Iterator[av.Packet]:
    """Packets of frames [start, stop) through `encode` (then flushed), each frame's pts its index in the whole
    video. Frames are converted (float → uint8 RGB → yuv420p) on a helper thread a few frames ahead of the
    encoder: in the encoding thread that conversion ran between x264's (multi-threaded) frame encodes, with the
    encoder's threads idle."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltx25-frames") as converter:
        ahead: deque = deque()
        for index in range(start, stop):
            ahead.append(converter.submit(_picture, frames[index], index))
            if len(ahead) > CONVERT_AHEAD:
                yield from encode(ahead.popleft().result())
        while ahead:
            yield from encode(ahead.popleft().result())
    yield from encode(None)


def x264_threads(segments: int) -> int:
    """Frame threads per x264 when `segments` encode at once: together as many as one x264 takes by itself
    (1.5 per core), not that many each — four segments of three saves made ~300 threads on 16 cores. 0 = x264's
    own choice (one segment)."""
    return 0 if segments <= 1 else max(1, round(1.5 * usable_cores() / segments))


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, as x264 counts them), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _encode_segment(frames: torch.Tensor, start: int, stop: int, size: tuple[int, int], rate: Fraction,
                    options: dict[str, str], threads: int) -> tuple[bytes, list[av.Packet]]:
    """Frames [start, stop) through an x264 of their own set up as the mp4 stream's (`size` = its even width and
    height): (its parameter sets, packets)."""
    context = av.CodecContext.create("libx264", "w")
    (context.width, context.height), context.pix_fmt = size, "yuv420p"
    context.time_base, context.framerate = 1 / rate, rate
    context.flags |= av.codec.context.Flags.global_header  # parameter sets out of band, as the mp4 stream's
    context.options, context.thread_type, context.thread_count = options, _THREAD_TYPE, threads
    packets = list(_encoded(context.encode, frames, start, stop))  # each in the context's time base
    return bytes(context.extradata or b""), packets


def segment_bounds(frames: int, segments: int) -> list[tuple[int, int]]:
    """[start, stop) of `segments` near-equal runs of `frames` (fewer when there are fewer frames)."""
    segments = max(1, min(segments, frames))
    cuts = [round(i * frames / segments) for i in range(segments + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


# A segment must be longer than x264's B-frame delay: one of 1-2 frames has none, and the next segment's first
# decode time then falls before its last one (seen at 5 frames in 2 segments). 8 keeps well clear of that.
MIN_SEGMENT_FRAMES = 8


def default_segments(frames: int) -> int:
    """One x264 per ~30 frames (a key frame every 1.25 s at 24 fps), at most 4."""
    return max(1, min(4, frames // 30))


def write_mp4(path: str, frames: torch.Tensor, fps: float, audio: torch.Tensor | None = None,
              sample_rate: int = 48000, metadata: Mapping[str, str] | None = None, crf: int = 17,
              segments: int | None = None) -> str:
    """Frames `[F, H, W, 3]` float in [0, 1] (+ optional audio `[C, S]` float in [−1, 1], C = 1 or 2) → H.264/AAC mp4.

    `metadata` values are stored as container tags (any key, through `movflags=use_metadata_tags`). The audio is
    fitted to F/fps seconds. Frames are converted a few at a time (`CONVERT_AHEAD`), so memory stays small.
    `segments` > 1 encodes that many runs of frames at once, each by its own x264 starting on a key frame, and
    joins their packets in one stream: x264's frame threads alone kept 11 of 16 cores busy (121 noise frames at
    1536×512: 1.16 s, 1.03 s in 4 segments; bench/bench_save_video.py). None: `default_segments`."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise LTX25Error("images", "the image batch shape", list(frames.shape), "[F, H, W, 3] with F ≥ 1")
    if not fps > 0:
        raise LTX25Error("fps", "fps", fps, "a frame rate > 0")
    rate = Fraction(fps).limit_denominator(1001)
    height, width = frames.shape[1] + frames.shape[1] % 2, frames.shape[2] + frames.shape[2] % 2
    container = av.open(path, mode="w", format="mp4", options={"movflags": "use_metadata_tags"})
    try:
        for key, value in (metadata or {}).items():
            container.metadata[key] = value
        video = container.add_stream("libx264", rate=rate)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        options = {"crf": str(crf), "preset": X264_PRESET}
        segments = default_segments(frames.shape[0]) if segments is None else segments
        first, *later = segment_bounds(frames.shape[0], max(1, min(segments, frames.shape[0] // MIN_SEGMENT_FRAMES)))
        threads = x264_threads(1 + len(later))
        video.options = dict(options)
        video.codec_context.thread_type, video.codec_context.thread_count = _THREAD_TYPE, threads
        sound = None
        if audio is not None:
            if audio.ndim != 2 or audio.shape[0] not in (1, 2):
                raise LTX25Error("audio", "the waveform shape", list(audio.shape), "[C, S] with C = 1 or 2")
            sound = container.add_stream("aac", rate=sample_rate, layout="stereo" if audio.shape[0] == 2 else "mono")
        with ThreadPoolExecutor(max_workers=max(1, len(later)), thread_name_prefix="ltx25-x264") as pool:
            pending = [pool.submit(_encode_segment, frames, start, stop, (width, height), rate, options,
                                   threads) for start, stop in later]
            for packet in _encoded(video.encode, frames, *first):
                container.mux(packet)
            for job in pending:
                # Joined streams must share one set of parameter sets, which identical x264 settings give; the
                # packets' decode times continue across the join because every segment has the same B-frame delay.
                extradata, packets = job.result()
                if extradata != bytes(video.codec_context.extradata or b""):
                    raise RuntimeError("x264 segments came out with different parameter sets; use segments=1")
                for packet in packets:
                    packet.stream = video
                    container.mux(packet)
        if sound is not None:
            samples = fit_audio(audio.float().cpu(), round(frames.shape[0] / float(rate) * sample_rate)).numpy()
            step = sound.codec_context.frame_size or 1024
            for start in range(0, samples.shape[1], step):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + step]),
                                                   format="fltp", layout=sound.layout.name)
                chunk.sample_rate, chunk.pts = sample_rate, start
                container.mux(sound.encode(chunk))
            container.mux(sound.encode(None))
    finally:
        container.close()
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
