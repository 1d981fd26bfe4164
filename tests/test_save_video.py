"""Saving video with sound (PyAV): the mp4 decodes back with the right frames, fps, size, audio and metadata; the
counter never overwrites; audio is fitted to the video; the node's UI/result contract."""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import time
from fractions import Fraction

import pytest
import torch

from nodes.comfy import bridge
from nodes.media import encoder_process
from nodes.media import mp4_encoder
from nodes.media import video_io
from nodes.ltx.errors import LTX25Error
from nodes.comfy.output import LTX25SaveVideo


@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(bridge, "_output_dir_override", str(tmp_path))
    return tmp_path


def _save(*args, **kwargs):
    """The node's save is a coroutine (ComfyUI runs it as a task): run it to the end."""
    return asyncio.run(LTX25SaveVideo().save(*args, **kwargs))


def _frames(count=25, height=64, width=96, seed=0):
    return torch.rand(count, height, width, 3, generator=torch.Generator().manual_seed(seed))


def _tone(seconds, rate=48000):
    t = torch.arange(round(seconds * rate)) / rate
    return torch.stack([torch.sin(2 * math.pi * 440 * t), torch.sin(2 * math.pi * 660 * t)]) * 0.3


def test_saved_mp4_decodes_back_with_frames_fps_size_audio_and_metadata(output_dir):
    """25 frames of 96×64 at 24 fps with a stereo track of 1 s: the file has 25 frames, 24 fps, 96×64, 2 channels
    at 48 kHz lasting 25/24 s (the track is fitted to the video; AAC rounds up to whole 1024-sample frames, so the
    decoded track is at most one AAC frame longer, never shorter), and the run metadata JSON in its tags."""
    info = {"prompt": "a fox", "seed": 7, "decoder": "conv", "seconds": 1.5}
    result = _save(_frames(), 24.0, "LTX25", {"waveform": _tone(1.0)[None], "sample_rate": 48000},
                                   json.dumps(info))
    probe = video_io.probe_mp4(result["result"][0])
    assert (probe.frames, probe.fps, probe.width, probe.height) == (25, 24.0, 96, 64)
    assert (probe.audio_channels, probe.sample_rate) == (2, 48000)
    assert 0 <= probe.audio_samples - 25 / 24 * 48000 < 1024, probe.audio_samples
    assert json.loads(probe.metadata["comment"]) == info


def test_counter_never_overwrites(output_dir):
    """Existing files keep their bytes; the next save numbers after the highest existing counter (a gap is not
    refilled) and two saves in a row get two names."""
    (output_dir / "LTX25_00001_.mp4").write_bytes(b"keep me")
    (output_dir / "LTX25_00007_.mp4").write_bytes(b"keep me too")
    first = _save(_frames(9), 24.0, "LTX25")["result"][0]
    second = _save(_frames(9), 24.0, "LTX25")["result"][0]
    assert os.path.basename(first) == "LTX25_00008_.mp4" and os.path.basename(second) == "LTX25_00009_.mp4"
    assert (output_dir / "LTX25_00001_.mp4").read_bytes() == b"keep me"
    assert (output_dir / "LTX25_00007_.mp4").read_bytes() == b"keep me too"


def test_node_returns_a_preview_entry_and_the_path(output_dir):
    """`{"ui": {"images": [{filename, subfolder, type: output, format: video/mp4}], "animated": (True,)},
    "result": (path,)}`, with a subfolder taken from the prefix."""
    out = _save(_frames(9), 24.0, "videos/run")
    entry = out["ui"]["images"][0]
    assert entry == {"filename": "run_00001_.mp4", "subfolder": "videos", "type": "output", "format": "video/mp4"}
    assert out["ui"]["animated"] == (True,)
    assert out["result"] == (str(output_dir / "videos" / "run_00001_.mp4"),) and os.path.getsize(out["result"][0])


def test_odd_sizes_are_padded_to_even(output_dir):
    """yuv420p needs even sizes: 33×47 frames are saved as 34×48 with the last row and column repeated (not
    rescaled, which PyAV would otherwise do silently): a white last column comes back two columns wide."""
    frames = torch.zeros(9, 33, 47, 3)
    frames[:, :, -1] = 1.0
    frames[:, -1, :] = 1.0
    path = _save(frames, 24.0, "odd")["result"][0]
    probe = video_io.probe_mp4(path)
    assert (probe.width, probe.height, probe.frames) == (48, 34, 9)
    import av
    with av.open(path) as container:
        first = next(iter(container.decode(video=0))).to_ndarray(format="rgb24")
    assert first[16, -2:].min() > 200 and first[-2:, 20].min() > 200, (first[16, -3:], first[-3:, 20])


def test_prefix_outside_the_output_folder_is_refused(output_dir):
    """A prefix with '..' or an absolute path cannot write outside the output folder."""
    for prefix in ("../escape", "/tmp/escape"):
        with pytest.raises(LTX25Error, match="filename prefix"):
            _save(_frames(9), 24.0, prefix)


def test_batch_audio_is_fitted_per_clip(output_dir):
    """Two clips decoded as a batch (frames one after the other) with two waveforms of slightly different
    lengths: each track is fitted to its clip, so the file's audio lasts exactly the video's 2·9/24 s."""
    audio = torch.stack([_tone(0.35), _tone(0.35)])[:, :, :16000]
    path = _save(_frames(18), 24.0, "batch", {"waveform": audio, "sample_rate": 48000})["result"][0]
    probe = video_io.probe_mp4(path)
    assert probe.frames == 18 and 0 <= probe.audio_samples - 18 / 24 * 48000 < 1024, probe.audio_samples


def test_decoded_audio_and_video_end_together(tiny_file, output_dir):
    """The tiny audio VAE's output (10–50 ms shorter than F/fps by construction) muxed with 17 frames at 24 fps:
    both streams of the file last 17/24 s."""
    from nodes.ltx import audio_vae as av
    vae = av.load_audio_vae(tiny_file("audio_vae"), torch.float32)
    audio = av.decode_audio(vae, torch.randn(1, 8, 18, 16), fps=24.0)
    assert audio["waveform"].shape[-1] < round(17 / 24 * 48000)
    path = _save(_frames(17), 24.0, "av", audio)["result"][0]
    probe = video_io.probe_mp4(path)
    assert probe.frames == 17 and 0 <= probe.audio_samples - 17 / 24 * 48000 < 1024, probe.audio_samples


def test_save_runs_on_a_worker_thread_so_the_next_node_can_go_on(output_dir):
    """The save is a coroutine whose encode runs on another thread: while it encodes, the event loop (ComfyUI's
    executor) is free — a ticker on the loop advances during the save. A plain function would block the loop."""
    import threading
    assert asyncio.iscoroutinefunction(LTX25SaveVideo.save)
    encoder_threads = set()
    original = encoder_process.write_mp4

    def spy(*args, **kwargs):
        encoder_threads.add(threading.get_ident())
        return original(*args, **kwargs)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        tick = asyncio.ensure_future(ticker())
        path = (await LTX25SaveVideo().save(_frames(49, 256, 256), 24.0, "thread"))["result"][0]
        tick.cancel()
        return path, ticks

    encoder_process.write_mp4 = spy
    try:
        path, ticks = asyncio.run(main())
    finally:
        encoder_process.write_mp4 = original
    assert encoder_threads and threading.get_ident() not in encoder_threads
    assert ticks > 3 and video_io.probe_mp4(path).frames == 49


@pytest.mark.skipif(not hasattr(os, "setpriority") or not sys.platform.startswith("linux"),
                    reason="per-thread nice values are Linux's")
def test_encodes_run_below_the_graphs_priority_and_leave_the_callers_alone(output_dir, monkeypatch):
    """The helper process's encoding threads run background.NICE below the graph, so the nodes running meanwhile
    keep their cores; the save's own thread (which only feeds the helper), the helper's reading thread, the event
    loop's thread and its default executor keep the graph's priority."""
    import threading
    from nodes.media import background
    encoder_process.close_helpers()  # a fresh helper, started by this save
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, set] = {"saver": set(), "helper": set()}
    original = encoder_process.write_mp4

    def spy(*args, **kwargs):
        seen["saver"].add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return original(*args, **kwargs)

    monkeypatch.setattr(encoder_process, "write_mp4", spy)
    done, busy, encode = threading.Event(), set(), encoder_process.EncoderProcess.encode

    def encoding(helper, *args):
        busy.add(helper)
        try:
            return encode(helper, *args)
        finally:
            busy.discard(helper)

    monkeypatch.setattr(encoder_process.EncoderProcess, "encode", encoding)

    def watch():  # the nice value (field 19 of /proc/…/stat) of every thread of the helper, while it encodes
        while not done.is_set():
            for helper in list(busy):
                with contextlib.suppress(OSError):
                    for task in os.listdir(f"/proc/{helper.process.pid}/task"):
                        with open(f"/proc/{helper.process.pid}/task/{task}/stat") as f:
                            seen["helper"].add(int(f.read().rsplit(")", 1)[1].split()[16]))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()

    async def main():
        path = (await LTX25SaveVideo().save(_frames(97, 256, 256), 24.0, "nice"))["result"][0]
        default_pool = await asyncio.to_thread(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return path, default_pool

    try:
        path, default_pool = asyncio.run(main())
    finally:
        done.set()
        watcher.join()
    assert seen["saver"] == {caller} and seen["helper"] == {caller, min(19, caller + background.NICE)}, seen
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller == default_pool
    assert video_io.probe_mp4(path).frames == 97


def test_a_run_cancelled_twice_still_waits_for_the_video(output_dir):
    """A second cancel while the save waits for its encode (the user presses stop again) does not abandon the
    wait: the task ends cancelled only once the file is whole."""
    async def main():
        task = asyncio.ensure_future(LTX25SaveVideo().save(_frames(97, 128, 128), 24.0, "twice"))
        path = output_dir / "twice_00001_.mp4"
        while not path.exists() or path.stat().st_size == 0:
            await asyncio.sleep(0.005)
        for _ in range(2):
            task.cancel()
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.CancelledError):
            await task
        return path

    path = asyncio.run(main())
    assert video_io.probe_mp4(str(path)).frames == 97


def test_a_failed_encode_leaves_no_file(output_dir, monkeypatch):
    """The name is reserved before the encode; if the encode fails, the reserved file goes too."""
    def broken(*args, **kwargs):
        raise RuntimeError("encoder died")

    monkeypatch.setattr(encoder_process, "write_mp4", broken)
    with pytest.raises(RuntimeError, match="encoder died"):
        _save(_frames(9), 24.0, "gone")
    assert not list(output_dir.iterdir())


def test_colours_come_back_from_the_file(output_dir):
    """Frames are [0, 1] RGB and the file's colours are what decoders assume: flat frames of eight colours, saved
    and decoded back to RGB by PyAV, keep their colour within 3/255 (yuv420p at crf 17, libswscale's integer
    conversions both ways), and a horizontal gradient keeps its values."""
    import av
    colours = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.5],
                            [0.9, 0.6, 0.2], [0.1, 0.3, 0.7]], dtype=torch.float32)
    frames = colours[:, None, None, :].expand(8, 32, 48, 3).clone()
    ramp = torch.linspace(0, 1, 48)[None, None, :, None].expand(1, 32, 48, 3)
    path = _save(torch.cat([frames, ramp]), 24.0, "colours")["result"][0]
    with av.open(path) as container:
        decoded = [torch.from_numpy(f.to_ndarray(format="rgb24")).float() / 255 for f in container.decode(video=0)]
    for index, colour in enumerate(colours):
        got = decoded[index][8:-8, 8:-8].reshape(-1, 3).mean(0)
        assert (got - colour).abs().max() < 3 / 255, (index, got, colour)
    assert (decoded[8][16, 4:-4] - ramp[0, 16, 4:-4]).abs().max() < 3 / 255


def test_a_cancelled_run_keeps_the_video_being_saved(output_dir):
    """When the run stops while a save encodes (a later node failed, the user cancelled: the executor's
    `asyncio.run` cancels pending tasks), the encoding thread cannot be stopped; it finishes and its complete file
    stays — neither deleted nor cut off."""
    async def run_then_fail():
        asyncio.ensure_future(LTX25SaveVideo().save(_frames(97, 128, 128), 24.0, "stopped"))
        path = output_dir / "stopped_00001_.mp4"
        while not path.exists() or path.stat().st_size == 0:  # until the encoder has written its first packets
            await asyncio.sleep(0.005)
        raise RuntimeError("a later node failed")

    with pytest.raises(RuntimeError, match="later node failed"):
        asyncio.run(run_then_fail())
    saved = list(output_dir.iterdir())
    assert [p.name for p in saved] == ["stopped_00001_.mp4"]
    assert video_io.probe_mp4(str(saved[0])).frames == 97


@pytest.mark.parametrize("fps", [24.0, 24000 / 1001])
def test_segmented_encode_is_one_stream_in_frame_order(tmp_path, fps):
    """Segments encoded at once by separate x264s join into one valid stream: every frame once, in order (each
    frame has its own flat brightness, read back), key frames where segments start, decode times rising across the
    joins, the audio muxed beside — at an NTSC rate and an odd size too."""
    import av
    count = 61
    level = torch.linspace(0.05, 0.95, count)
    frames = (torch.rand(count, 47, 66, 3, generator=torch.Generator().manual_seed(1)) * 0.04
              + level[:, None, None, None])
    path = str(tmp_path / "seg.mp4")
    video_io.write_mp4(path, frames, fps, _tone(count / fps), segments=3)
    with av.open(path) as container:
        packets = [p for p in container.demux(video=0) if p.size]
        dts = [p.dts for p in packets]
        keys = sorted(p.pts for p in packets if p.is_keyframe)
        assert all(a < b for a, b in zip(dts, dts[1:])), dts
        rate = container.streams.video[0].time_base
    starts = [start for start, _ in mp4_encoder.segment_bounds(count, 3)]
    assert [round(float(k * rate) * fps) for k in keys] == starts == [0, 20, 41]
    with av.open(path) as container:
        means = [float(f.to_ndarray(format="rgb24").mean()) / 255 for f in container.decode(video=0)]
    assert len(means) == count
    assert max(abs(m - float(v) - 0.02) for m, v in zip(means, level)) < 0.02
    probe = video_io.probe_mp4(path)
    assert (probe.width, probe.height, probe.audio_channels) == (66, 48, 2)


@pytest.mark.parametrize("count, segments", [(5, 2), (9, 4), (12, 5), (17, 2), (40, 4), (2, 4), (1, 3)])
def test_short_clips_get_segments_long_enough_for_the_b_frame_delay(tmp_path, count, segments):
    """A segment shorter than x264's B-frame delay has none, and the next segment's first decode time would fall
    before the previous one's last (the mux then fails): segments hold at least MIN_SEGMENT_FRAMES frames, so any
    requested count gives a valid file with every frame once, in order."""
    import av
    level = torch.linspace(0.05, 0.95, count)
    frames = torch.zeros(count, 32, 48, 3) + level[:, None, None, None]
    path = str(tmp_path / "short.mp4")
    video_io.write_mp4(path, frames, 24.0, segments=segments)
    with av.open(path) as container:
        keys = sum(1 for p in container.demux(video=0) if p.size and p.is_keyframe)
    with av.open(path) as container:
        means = [float(f.to_ndarray(format="rgb24").mean()) / 255 for f in container.decode(video=0)]
    assert len(means) == count and max(abs(m - float(v)) for m, v in zip(means, level)) < 0.02
    assert keys == max(1, min(segments, count // mp4_encoder.MIN_SEGMENT_FRAMES))


def test_segment_bounds_and_the_default_count():
    assert mp4_encoder.segment_bounds(121, 4) == [(0, 30), (30, 60), (60, 91), (91, 121)]
    assert mp4_encoder.segment_bounds(3, 8) == [(0, 1), (1, 2), (2, 3)]
    assert [mp4_encoder.default_segments(n) for n in (1, 29, 30, 61, 121, 1000)] == [1, 1, 1, 2, 4, 4]


def test_segments_share_one_x264s_worth_of_threads(monkeypatch):
    """Segments encoding at once split the frame threads one x264 would take (1.5 per core) instead of each taking
    that many; a single segment leaves the choice to x264 (0)."""
    monkeypatch.setattr(mp4_encoder, "usable_cores", lambda: 16)
    assert mp4_encoder.x264_threads(1) == 0
    assert [mp4_encoder.x264_threads(n) for n in (2, 3, 4)] == [12, 8, 6]
    monkeypatch.setattr(mp4_encoder, "usable_cores", lambda: 2)
    assert mp4_encoder.x264_threads(4) == 1


def test_each_segments_x264_gets_its_share_of_threads(tmp_path, monkeypatch):
    import av
    made = []
    create = av.CodecContext.create

    def spy(*args, **kwargs):
        made.append(create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(mp4_encoder, "x264_threads", lambda segments: 10 + segments)
    monkeypatch.setattr(av.CodecContext, "create", spy)
    video_io.write_mp4(str(tmp_path / "t.mp4"), _frames(24), 24.0, segments=3)
    assert [c.thread_count for c in made] == [13, 13]  # the two later segments (the first is the stream's own)


def test_inference_tensors_save_from_the_worker_thread(output_dir):
    """ComfyUI hands the save inference tensors (its executor runs in inference mode, which is per thread); the
    encode thread runs outside it and must only read them — odd sizes (padded) and audio included."""
    with torch.inference_mode():
        frames, waveform = torch.rand(9, 33, 47, 3), torch.rand(1, 2, 20000) - 0.5
        path = _save(frames, 24.0, "inference", {"waveform": waveform, "sample_rate": 48000})["result"][0]
    probe = video_io.probe_mp4(path)
    assert (probe.frames, probe.width, probe.height, probe.audio_channels) == (9, 48, 34, 2)


def test_the_audio_is_encoded_beside_the_video_not_after_it(tmp_path, monkeypatch):
    """AAC took 0.3 s on one core after the x264s had finished — the last save's tail in the A/B graph. The last
    frame is handed over only once the audio is encoded, which works only if the audio does not wait for the
    video; the file still holds both, whole."""
    import threading

    import av
    import numpy as np
    audio_done, encode_audio = threading.Event(), mp4_encoder._encode_audio

    def encode_then_tell(*args):
        packets = encode_audio(*args)
        audio_done.set()
        return packets

    class LastFrameAfterTheAudio:
        def __init__(self, frames: np.ndarray) -> None:
            self.frames, self.shape = frames, frames.shape

        def __getitem__(self, index: int) -> np.ndarray:
            if index == self.shape[0] - 1:
                assert audio_done.wait(10), "the audio waited for the video's last frame"
            return self.frames[index]

    monkeypatch.setattr(mp4_encoder, "_encode_audio", encode_then_tell)
    path, frames = str(tmp_path / "a.mp4"), _frames(48).numpy()
    mp4_encoder.encode_mp4(path, LastFrameAfterTheAudio(frames), Fraction(24), audio=_tone(2.0).numpy())
    with av.open(path) as container:
        video, sound = container.streams.video[0], container.streams.audio[0]
        assert video.frames == 48 and abs(float(sound.duration * sound.time_base) - 2.0) < 0.05
