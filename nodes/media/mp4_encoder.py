"""H.264 (libx264, yuv420p) + AAC mp4 from float RGB frames in [0, 1], with PyAV and numpy only.

yuv420p stores colour at half resolution, so width and height must be even: odd frames get their last row/column
repeated (not rescaled, which PyAV would otherwise do silently).

Also the program of the saves' helper processes (`main`, started by encoder_process): it imports nothing else, so
a helper starts fast, and, having no relative imports, it loads from its file alone.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, BinaryIO, Iterator, Mapping

import av
import numpy as np

# x264's "veryfast" at crf 17: several times faster than the default "medium" on noise-like frames and somewhat
# faster on smooth ones (docs/PERFORMANCE.md); the crf keeps the quality, the files grow a little.
X264_PRESET = "veryfast"
# x264's frame threads: faster than slice threads once the frames are converted on a helper thread
# (bench/bench_save_video.py); before that, the serial conversion starved them
_THREAD_TYPE = "FRAME"
CONVERT_AHEAD = 4  # frames converted to yuv420p ahead of the encoder (each a few MB)
# A segment must be longer than x264's B-frame delay: one of 1-2 frames has none, and the next segment's first
# decode time then falls before its last one (seen at 5 frames in 2 segments). 8 keeps well clear of that.
MIN_SEGMENT_FRAMES = 8
Frames = Any  # `.shape` [F, H, W, 3] and `[i]` → float32 [H, W, 3]: a numpy array, or a helper's arriving frames


def rgb24(frame: np.ndarray) -> np.ndarray:
    """`[H, W, 3]` float in [0, 1] → uint8 `[H', W', 3]` (even sizes), rounded to nearest (half to even). One scaled
    copy converted in place: a temporary per operation made the conversion cost as much as the encode."""
    scaled = np.multiply(frame, 255, dtype=np.float32)
    np.clip(scaled, 0, 255, out=scaled)
    rgb = np.rint(scaled, out=scaled).astype(np.uint8)
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    return np.pad(rgb, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge") if pad_h or pad_w else rgb


def even_size(frames: Frames) -> tuple[int, int]:
    """(height, width) of the encoded frames."""
    return frames.shape[1] + frames.shape[1] % 2, frames.shape[2] + frames.shape[2] % 2


def _picture(frames: Frames, index: int) -> av.VideoFrame:
    picture = av.VideoFrame.from_ndarray(rgb24(frames[index]), format="rgb24").reformat(format="yuv420p")
    picture.pts = index
    return picture


def _encoded(encode, frames: Frames, start: int, stop: int) -> Iterator[av.Packet]:
    """Packets of frames [start, stop) through `encode` (then flushed), each frame's pts its index in the whole
    video. Frames are converted (float → uint8 RGB → yuv420p) on a helper thread a few frames ahead of the encoder:
    in the encoding thread that conversion ran between x264's (multi-threaded) frame encodes, with x264 idle."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltx25-frames") as converter:
        ahead: deque = deque()
        try:
            for index in range(start, stop):
                ahead.append(converter.submit(_picture, frames, index))
                if len(ahead) > CONVERT_AHEAD:
                    yield from encode(ahead.popleft().result())
            while ahead:
                yield from encode(ahead.popleft().result())
        except BaseException:  # this run stops (also when its packets cannot be muxed: GeneratorExit)
            # frames still arriving: stop taking them, or the untaken ones fill the helper's room and the other
            # runs (and this run's converter, which the pool waits for) wait for frames forever
            getattr(frames, "close", lambda: None)()
            raise
    yield from encode(None)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, as x264 counts them), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def x264_threads(segments: int) -> int:
    """Frame threads per x264 when `segments` encode at once: together as many as one x264 takes by itself
    (1.5 per core), not that many each — four segments of three saves made ~300 threads on 16 cores. 0 = x264's
    own choice (one segment)."""
    return 0 if segments <= 1 else max(1, round(1.5 * usable_cores() / segments))


def segment_bounds(frames: int, segments: int) -> list[tuple[int, int]]:
    """[start, stop) of `segments` near-equal runs of `frames` (fewer when there are fewer frames)."""
    segments = max(1, min(segments, frames))
    cuts = [round(i * frames / segments) for i in range(segments + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def default_segments(frames: int) -> int:
    """One x264 per ~30 frames (a key frame every 1.25 s at 24 fps), at most 4."""
    return max(1, min(4, frames // 30))


def segments_of(frames: int, segments: int | None) -> list[tuple[int, int]]:
    """The runs `encode_mp4` encodes at once: `segments` of them (None: `default_segments`), each at least
    MIN_SEGMENT_FRAMES long."""
    segments = default_segments(frames) if segments is None else segments
    return segment_bounds(frames, max(1, min(segments, frames // MIN_SEGMENT_FRAMES)))


def arrival_order(frames: int, segments: int | None) -> list[int]:
    """The order a helper receives frames in: the segments' frames in turn, so every segment's x264 starts with
    the first frames that arrive instead of the last one waiting for most of the clip."""
    runs = [range(start, stop) for start, stop in segments_of(frames, segments)]
    return [run[i] for i in range(max(map(len, runs))) for run in runs if i < len(run)]


def _encode_segment(frames: Frames, start: int, stop: int, rate: Fraction, options: dict[str, str],
                    threads: int) -> tuple[bytes, list[av.Packet]]:
    """Frames [start, stop) through an x264 of their own set up as the mp4 stream's: (its parameter sets, packets)."""
    context = av.CodecContext.create("libx264", "w")
    (context.height, context.width), context.pix_fmt = even_size(frames), "yuv420p"
    context.time_base, context.framerate = 1 / rate, rate
    context.flags |= av.codec.context.Flags.global_header  # parameter sets out of band, as the mp4 stream's
    context.options, context.thread_type, context.thread_count = options, _THREAD_TYPE, threads
    packets = list(_encoded(context.encode, frames, start, stop))  # each in the context's time base
    return bytes(context.extradata or b""), packets


def encode_mp4(path: str, frames: Frames, rate: Fraction, audio: np.ndarray | None = None,
               sample_rate: int = 48000, metadata: Mapping[str, str] | None = None, crf: int = 17,
               segments: int | None = None) -> None:
    """Float RGB frames `[F, H, W, 3]` in [0, 1] at `rate` fps (+ float32 audio `[C, S]`, C = 1 or 2, already the
    video's length) → `path`. `metadata` values become container tags. `segments` > 1 encodes that many runs
    of frames at once, each by its own x264 starting on a key frame, and joins their packets in one stream: x264's
    frame threads alone leave cores idle on a many-core machine (bench/bench_save_video.py). None:
    `default_segments`. Each frame is read once, `frames[i]`."""
    container = av.open(path, mode="w", format="mp4", options={"movflags": "use_metadata_tags"})
    try:
        for key, value in (metadata or {}).items():
            container.metadata[key] = value
        video = container.add_stream("libx264", rate=rate)
        (video.height, video.width), video.pix_fmt = even_size(frames), "yuv420p"
        options = {"crf": str(crf), "preset": X264_PRESET}
        first, *later = segments_of(frames.shape[0], segments)
        threads = x264_threads(1 + len(later))
        video.options = dict(options)
        video.codec_context.thread_type, video.codec_context.thread_count = _THREAD_TYPE, threads
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate, layout="stereo" if audio.shape[0] == 2 else "mono")
        container.start_encoding()  # every encoder opened here, before the audio's is used on a thread of its own
        with ThreadPoolExecutor(max_workers=len(later) + 1, thread_name_prefix="ltx25-x264") as pool:
            # AAC after the video ran on one core after the x264s had finished: the last save's tail
            sound_packets = pool.submit(_encode_audio, sound, audio, sample_rate) if sound is not None else None
            pending = [pool.submit(_encode_segment, frames, start, stop, rate, options, threads)
                       for start, stop in later]
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


# The helper process's side. Messages are length-prefixed pickles; a request's frames follow it as raw bytes.
_LENGTH = struct.Struct("<Q")


def write_message(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def read_message(stream: BinaryIO) -> object | None:
    """The next message, or None when the other side has closed the pipe."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    return pickle.loads(stream.read(_LENGTH.unpack(head)[0]))


class _Arriving:
    """A request's frames as they come off the pipe (in `arrival_order`), for `encode_mp4`: `frames[i]` waits for
    frame i and hands it over (each is read once). At most `room` frames wait to be taken, so a helper holds a few
    frames, not the clip (the pipe holds the sender back meanwhile)."""

    def __init__(self, shape: tuple[int, ...], room: int) -> None:
        self.shape, self.room = shape, room
        self.error: BaseException | None = None
        self._waiting: dict[int, np.ndarray] = {}
        self._closed = False  # the encode has ended: later frames are read and dropped
        self._changed = threading.Condition()

    def receive(self, stream: BinaryIO, order: list[int]) -> None:
        try:
            for count, index in enumerate(order):
                frame = np.empty(self.shape[1:], dtype=np.float32)
                view, got = memoryview(frame).cast("B"), 0
                while got < len(view):
                    n = stream.readinto(view[got:])
                    if not n:
                        raise EOFError(f"the frames stopped after {count} of {self.shape[0]}")
                    got += n
                with self._changed:
                    self._changed.wait_for(lambda: len(self._waiting) < self.room or self._closed)
                    if not self._closed:
                        self._waiting[index] = frame
                        self._changed.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the encoder's threads by __getitem__
            with self._changed:
                self.error = error
                self._changed.notify_all()

    def __getitem__(self, index: int) -> np.ndarray:
        with self._changed:
            self._changed.wait_for(lambda: index in self._waiting or self.error is not None or self._closed)
            if index not in self._waiting:
                raise self.error or RuntimeError("the encode has stopped taking frames")
            self._changed.notify_all()
            return self._waiting.pop(index)

    def close(self) -> None:
        """No more frames are taken (the encode has ended or failed): those waiting and those still to come are
        dropped, and any wait for one raises."""
        with self._changed:
            self._closed = True
            self._waiting.clear()
            self._changed.notify_all()


def _encode_below(nice: int, frames: _Arriving, reply: list, **arguments) -> None:
    """`encode_mp4` on a thread `nice` below the helper's main thread (its x264 and converter threads inherit it:
    Linux), which reads the frames off the pipe at the saving process's priority and so keeps the encoders fed."""
    if nice and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))
    try:
        encode_mp4(frames=frames, **arguments)
        reply.append(("ok", None))
    except Exception as error:  # noqa: BLE001 - reported to the saving process, which raises it
        reply.append(("error", f"{type(error).__name__}: {error}"))
    finally:
        frames.close()  # a failed encode takes no more frames: the rest are read off the pipe and dropped


FRAMES_WAITING_PER_SEGMENT = 8  # frames a helper holds per segment at most (each a few MB)


def serve(requests: BinaryIO, replies: BinaryIO, nice: int = 0) -> None:
    """Encode requests until `requests` closes: each is a dict of `encode_mp4`'s arguments with `shape` for the
    float32 frames, which follow it on the pipe in `arrival_order` and are encoded as they arrive. Replies "ready"
    once, then per request ("ok", None) or ("error", message)."""
    write_message(replies, "ready")
    while (request := read_message(requests)) is not None:
        shape = request.pop("shape")
        order = arrival_order(shape[0], request["segments"])
        frames = _Arriving(shape, FRAMES_WAITING_PER_SEGMENT * len(segments_of(shape[0], request["segments"])))
        reply: list = []
        encoder = threading.Thread(target=_encode_below, args=(nice, frames, reply), kwargs=request,
                                   name="ltx25-encode")
        encoder.start()
        frames.receive(requests, order)
        encoder.join()
        if frames.error is not None:  # the saving process went away mid-request
            return
        write_message(replies, reply[0])


def main() -> None:
    """The helper process: requests on stdin, replies on stdout; argv[2]: how far below it the encodes run."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else written to stdout (a library's print) goes to stderr, not into the replies
    serve(sys.stdin.buffer, replies, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
