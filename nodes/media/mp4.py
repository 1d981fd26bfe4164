"""MP4 files for the Save Video node: H.264 (libx264, yuv420p) + AAC from float RGB frames, with PyAV, numpy and
the standard library only (no torch: scripts and tests import it alone).

`reserve` takes the next free `prefix_00001_.mp4`-style name (ComfyUI's naming) and `save_mp4` encodes into it:
the file is written as `<name>.part` in the same folder and renamed once complete, so a save stopped anywhere (an
error, an interrupt, a signal, a killed process) leaves no file under a final name; every exit path Python can
catch removes the partial file.

yuv420p stores colour at half resolution, so width and height must be even: odd frames get their last row/column
repeated (not rescaled, which PyAV would otherwise do silently). The audio is fitted to the video's duration
(silence appended, or the tail cut) so both streams end together: the LTX audio VAE yields 10–50 ms less than F/fps
by construction (docs/MODEL.md §11); a larger difference is logged, since it means the audio or the fps belongs to
another clip.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterator, Mapping

import av
import numpy as np

from ..ltx.errors import LTX25Error
from .output_folder import resolve_prefix

log = logging.getLogger(__name__)

COUNTER_DIGITS = 5
PART_SUFFIX = ".part"
# x264's "veryfast" at crf 17: several times faster than the default "medium" on noise-like frames and faster on
# smooth ones (docs/PERFORMANCE.md); the crf keeps the quality, the files grow a little.
X264_PRESET = "veryfast"
# Frames are converted to yuv420p on CONVERTERS threads, up to CONVERT_AHEAD frames ahead of the encoder (a few MB
# each at 1080p). Three converters sped a lone 3840-wide save up by a quarter but slowed the other saves when the
# A/B graph's three run at once, and the three together by little (docs/PERFORMANCE.md): one is kept.
CONVERTERS = 1
CONVERT_AHEAD = 4
AUDIO_SLACK_S = 0.1  # audio shorter or longer than the video by more than this is logged (the VAE's gap is ≤ 50 ms)


# ------------------------------------------------------------------------------------------------ output names
@dataclass(frozen=True)
class OutputName:
    """A reserved output file: `part` exists (the reservation), `path` does not until `publish` renames it."""
    folder: str
    filename: str
    subfolder: str   # relative to the output folder, "/"-separated; "" at its root
    number: int      # the counter, shared by a run's files (`reserve`)

    @property
    def path(self) -> str:
        return os.path.join(self.folder, self.filename)

    @property
    def part(self) -> str:
        return self.path + PART_SUFFIX


def reserve(directory: str, prefix: str, number: int | None = None, ext: str = "mp4",
            where: str = "filename_prefix") -> OutputName:
    """The next `prefix_00001_.mp4`-style name in `directory`, reserved by creating its `.part` file exclusively.

    `prefix` may hold subfolders ("videos/LTX25") but must stay inside `directory`, symlinks resolved. The counter
    is one past the highest of every counted `.ext` file in the folder (any prefix, finished or being written), so
    `number` — the counter an earlier save of the same run got — is free for this prefix unless a file took it;
    then the next one is used. That way a run's files share one counter, and runs saving into one folder at once
    never interleave. Processes reserving in one folder take turns (`_folder_lock`). Bad prefixes raise
    LTX25Error naming `where`."""
    folder, base, subfolder = resolve_prefix(directory, prefix, where)

    def named(counter: int) -> OutputName:
        return OutputName(folder, f"{base}_{counter:0{COUNTER_DIGITS}d}_.{ext}", subfolder, counter)

    try:
        os.makedirs(folder, exist_ok=True)
        with _folder_lock(folder):
            existing = set(os.listdir(folder))
            if number is not None and {named(number).filename, named(number).filename + PART_SUFFIX} & existing:
                log.warning("LTX-2.5 save: %s is taken; this run's files do not share one counter",
                            named(number).filename)
                number = None
            if number is None:
                number = 1 + max((n for n in (counter_of(f, ext) for f in existing) if n is not None), default=0)
            while True:
                try:
                    with open(named(number).part, "xb"):
                        return named(number)
                except FileExistsError:  # written by something that does not take the folder's lock
                    number += 1
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:  # a name over the file system's NAME_MAX (255 bytes on most)
            raise LTX25Error(where, "the filename prefix", repr(prefix), "a name this file system can create",
                             "Shorten the prefix, or split it into subfolders.") from error
        # Not the prefix's fault: a read-only output folder, a file where a folder should be, a full disk
        raise LTX25Error(where, "the output folder", folder, "a folder this process can create and write in",
                         f"{error.strerror or error}. Check the output folder (ComfyUI's --output-directory) and "
                         "the subfolders the prefix names.") from error


def counter_of(filename: str, ext: str = "mp4") -> int | None:
    """The counter of a `<prefix>_<counter>_.<ext>` file name, finished or being written (`.part`); else None."""
    found = re.fullmatch(rf".+_(\d{{{COUNTER_DIGITS},}})_\.{re.escape(ext)}(?:{re.escape(PART_SUFFIX)})?", filename)
    return int(found[1]) if found else None


def publish(name: OutputName) -> str:
    """The finished `part` renamed to its final name (atomic; the reservation keeps other saves off the name)."""
    os.replace(name.part, name.path)
    return name.path


def discard(name: OutputName) -> None:
    """The reservation given up: its part file removed (already gone is fine)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(name.part)


@contextlib.contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """An exclusive lock on `folder` (flock on the directory: released when the process ends, however it ends), so
    processes saving into one folder reserve names in turn. Without flock (Windows, some network file systems) the
    exclusive creation of each `.part` alone keeps names apart."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    handle = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EBADF, errno.EINVAL):
                raise
            log.debug("LTX-2.5 save: %s cannot be locked (%s); names are kept apart by exclusive creation only",
                      folder, error)
        yield
    finally:
        os.close(handle)  # releases the lock


# ------------------------------------------------------------------------------------------------ the save
def save_mp4(name: OutputName, frames: np.ndarray, fps: float, audio: np.ndarray | None = None,
             sample_rate: int = 48000, metadata: Mapping[str, str] | None = None, crf: int = 17,
             check: Callable[[], None] | None = None, node: str = "save_mp4") -> str:
    """Float RGB frames `[F, H, W, 3]` in [0, 1] (+ float audio `[C, S]` in [−1, 1], C = 1 or 2, fitted to F/fps
    seconds) → an H.264/AAC mp4 at `name` (from `reserve`); returns its path. `metadata` values become container
    tags. `check` is called before each frame is encoded and may raise to stop the save (an interrupt); whatever
    stops it, the partial file is removed. Bad inputs raise LTX25Error naming `node`'s input."""
    try:
        rate = _frame_rate(fps, node)
        _check_frames(frames, node)
        if audio is not None:
            audio = fit_audio(_checked_audio(audio, node), round(frames.shape[0] / rate * sample_rate), sample_rate,
                              node)
        try:
            _encode(name.part, frames, rate, audio, sample_rate, metadata or {}, crf, check)
            return publish(name)
        except OSError as error:  # a full disk, an output folder gone or made read-only meanwhile
            raise LTX25Error(node, "writing the video", name.part, "a file this process can write",
                             f"{error.strerror or error}. Free disk space, or set another output folder.") from error
    except BaseException:
        discard(name)
        raise


def _frame_rate(fps: float, node: str) -> Fraction:
    if not fps > 0:
        raise LTX25Error(f"{node}.fps", "fps", fps, "a frame rate > 0")
    return Fraction(fps).limit_denominator(1001)  # 24000/1001 stays exact


def _check_frames(frames: np.ndarray, node: str) -> None:
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise LTX25Error(f"{node}.images", "the image batch shape", list(frames.shape), "[F, H, W, 3] with F ≥ 1")


def _checked_audio(audio: np.ndarray, node: str) -> np.ndarray:
    if audio.ndim != 2 or audio.shape[0] not in (1, 2):
        raise LTX25Error(f"{node}.audio", "the waveform shape", list(audio.shape), "[C, S] with C = 1 or 2")
    return audio


def fit_audio(waveform: np.ndarray, samples: int, sample_rate: int, where: str = "audio") -> np.ndarray:
    """`[C, S]` → float32 `[C, samples]`: silence appended or the tail cut; a gap over AUDIO_SLACK_S is logged."""
    gap = (waveform.shape[-1] - samples) / sample_rate
    if abs(gap) > AUDIO_SLACK_S:
        log.warning("%s: the audio lasts %.3f s and the video %.3f s; the audio is %s to the video's length. Is the "
                    "fps the one the frames were made at?", where, waveform.shape[-1] / sample_rate,
                    samples / sample_rate, "cut" if gap > 0 else "padded with silence")
    fitted = np.zeros((waveform.shape[0], samples), dtype=np.float32)
    kept = min(samples, waveform.shape[-1])
    fitted[:, :kept] = waveform[:, :kept]
    return fitted


def rgb24(frame: np.ndarray) -> np.ndarray:
    """`[H, W, 3]` float in [0, 1] → uint8 `[H', W', 3]` (even sizes), rounded to nearest (half to even). One scaled
    copy converted in place: a temporary per operation made the conversion cost as much as the encode."""
    scaled = np.multiply(frame, 255, dtype=np.float32)
    np.clip(scaled, 0, 255, out=scaled)
    rgb = np.rint(scaled, out=scaled).astype(np.uint8)
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    return np.pad(rgb, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge") if pad_h or pad_w else rgb


def _picture(frames: np.ndarray, index: int) -> av.VideoFrame:
    picture = av.VideoFrame.from_ndarray(rgb24(frames[index]), format="rgb24").reformat(format="yuv420p")
    picture.pts = index
    return picture


def _encode(path: str, frames: np.ndarray, rate: Fraction, audio: np.ndarray | None, sample_rate: int,
            metadata: Mapping[str, str], crf: int, check: Callable[[], None] | None) -> None:
    """One x264 with its own frame threads; the frames converted to yuv420p a few ahead on a helper thread (in the
    encoding thread that conversion ran between x264's frame encodes, with x264 idle); the AAC encoded beside the
    video on another (after it, it was the save's serial tail)."""
    container = av.open(path, mode="w", format="mp4", options={"movflags": "use_metadata_tags"})
    try:
        for key, value in metadata.items():
            container.metadata[key] = value
        video = container.add_stream("libx264", rate=rate)
        video.height, video.width = frames.shape[1] + frames.shape[1] % 2, frames.shape[2] + frames.shape[2] % 2
        video.pix_fmt, video.options = "yuv420p", {"crf": str(crf), "preset": X264_PRESET}
        video.codec_context.thread_type = "FRAME"
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate, layout="stereo" if audio.shape[0] == 2 else "mono")
        container.start_encoding()  # every encoder opened here, before the audio's is used on a thread of its own
        with ThreadPoolExecutor(max_workers=CONVERTERS + 1, thread_name_prefix="ltx25-save") as helpers:
            sound_packets = helpers.submit(_encode_audio, sound, audio, sample_rate) if sound is not None else None
            ahead: deque = deque()
            for index in range(frames.shape[0]):
                if check is not None:
                    check()
                ahead.append(helpers.submit(_picture, frames, index))
                if len(ahead) > CONVERT_AHEAD:
                    container.mux(video.encode(ahead.popleft().result()))
            while ahead:
                container.mux(video.encode(ahead.popleft().result()))
            container.mux(video.encode(None))
            if sound_packets is not None:
                container.mux(sound_packets.result())
    finally:
        container.close()


def _encode_audio(sound: av.audio.stream.AudioStream, audio: np.ndarray, sample_rate: int) -> list[av.Packet]:
    """Float32 `[C, S]` through the (opened) AAC encoder of `sound`: its packets, to be muxed by the caller."""
    packets, step = [], sound.codec_context.frame_size or 1024
    for start in range(0, audio.shape[1], step):
        chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio[:, start:start + step]), format="fltp",
                                           layout=sound.layout.name)
        chunk.sample_rate, chunk.pts = sample_rate, start
        packets += sound.encode(chunk)
    return packets + sound.encode(None)


# ------------------------------------------------------------------------------------------------ reading back
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
