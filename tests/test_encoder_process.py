"""Saves encoded by helper processes (nodes.media.encoder_process): the same file as an encode in this process, no
encoding thread left in this process, helpers reused, and every failure reported by name without a hang or a
helper left waiting."""
from __future__ import annotations

import logging
import sys
import threading
import time

import av
import numpy as np
import pytest
import torch

from nodes.media import encoder_process
from nodes.media import mp4_encoder
from nodes.media import video_io
def _frames(count=20, height=33, width=47, seed=0):
    return torch.rand(count, height, width, 3, generator=torch.Generator().manual_seed(seed))


def _failure_in_time(path: str, frames: torch.Tensor, **settings) -> RuntimeError:
    """The RuntimeError of a save that must fail, within a minute (a hang fails the test instead of stalling it)."""
    errors: list[RuntimeError] = []

    def save():
        try:
            encoder_process.write_mp4(path, frames, 24.0, **settings)
        except RuntimeError as error:
            errors.append(error)

    saving = threading.Thread(target=save, daemon=True)
    saving.start()
    saving.join(timeout=60)
    assert not saving.is_alive(), "the save hangs: the helper waits for frames nobody sends or room nobody frees"
    assert len(errors) == 1, "the save did not fail"
    return errors[0]


@pytest.fixture(autouse=True)
def fresh_helpers(monkeypatch):
    """No helpers at the start; none started ahead unless a test asks (so the others count helpers exactly)."""
    encoder_process.close_helpers()
    monkeypatch.setattr(encoder_process, "SPARES", 0)
    yield
    encoder_process.close_helpers()


def _same_video(here: str, there: str) -> None:
    """The two files hold the same frames: as many, each within 30 dB PSNR of its twin. Not byte for byte: x264s
    encoding segments at once now and then code a frame differently from identical input (seen 33.5 dB apart, in
    about 1 of 5 runs, with every frame's float, RGB and YUV input hashed equal); a frame out of place is ~11 dB."""
    def frames(path):
        with av.open(path) as container:
            return [f.to_ndarray(format="rgb24").astype(np.float64) for f in container.decode(video=0)]
    a, b = frames(here), frames(there)
    assert len(a) == len(b)
    mse = [float(((x - y) ** 2).mean()) for x, y in zip(a, b)]
    assert all(m == 0 or 10 * np.log10(255**2 / m) > 30 for m in mse), mse


def test_a_helpers_file_is_the_file_this_process_writes(tmp_path):
    """Frames streamed to the helper (odd size, padded; audio; tags; 3 segments) give the video that the
    in-process encode gives."""
    frames, audio = _frames(40), torch.rand(2, 80000) - 0.5
    here, there = str(tmp_path / "here.mp4"), str(tmp_path / "there.mp4")
    video_io.write_mp4(here, frames, 24.0, audio, 48000, {"comment": "{}"}, segments=3)
    encoder_process.write_mp4(there, frames, 24.0, audio, 48000, {"comment": "{}"}, segments=3)
    _same_video(here, there)
    assert video_io.probe_mp4(here) == video_io.probe_mp4(there)  # size, audio, tags


def test_no_encoding_thread_runs_in_this_process(tmp_path):
    """While a save encodes, this process holds no x264 feeder or frame converter thread: they take the GIL for
    every frame, and the graph's threads would wait for it."""
    names: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            names.update(t.name for t in threading.enumerate())
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        encoder_process.write_mp4(str(tmp_path / "v.mp4"), _frames(97, 128, 128), 24.0)
    finally:
        done.set()
        watcher.join()
    assert not {n for n in names if n.startswith(("ltx25-x264", "ltx25-frames"))}, names
    assert video_io.probe_mp4(str(tmp_path / "v.mp4")).frames == 97


def test_helpers_are_reused_and_saves_at_once_get_one_each(tmp_path):
    encoder_process.write_mp4(str(tmp_path / "a.mp4"), _frames(9), 24.0)
    first = [h.process.pid for h in encoder_process._IDLE]
    encoder_process.write_mp4(str(tmp_path / "b.mp4"), _frames(9), 24.0)
    assert [h.process.pid for h in encoder_process._IDLE] == first and len(first) == 1
    _saves_at_once(tmp_path, "c", 3, 60)
    assert len({h.process.pid for h in encoder_process._IDLE}) == 3


def _saves_at_once(folder, prefix: str, saves: int, frames: int) -> None:
    """`saves` saves of `frames` frames each, on threads at once; each file then holds its frames."""
    threads = [threading.Thread(target=encoder_process.write_mp4,
                                args=(str(folder / f"{prefix}{i}.mp4"), _frames(frames), 24.0)) for i in range(saves)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(video_io.probe_mp4(str(folder / f"{prefix}{i}.mp4")).frames == frames for i in range(saves))


def _idle_pids(count: int) -> set[int]:
    """The idle helpers' pids once there are `count` of them (a spare starts in the background)."""
    deadline = time.monotonic() + 60
    while len(encoder_process._IDLE) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return {h.process.pid for h in encoder_process._IDLE}


def test_a_spare_helper_is_ready_for_the_next_save_at_once(tmp_path, monkeypatch):
    """The save that takes the last idle helper starts one more in the background, so saves that begin while others
    encode (the A/B graph's) find a helper waiting instead of starting one beside busy encoders."""
    monkeypatch.setattr(encoder_process, "SPARES", 1)
    encoder_process.write_mp4(str(tmp_path / "a.mp4"), _frames(9), 24.0)
    two = _idle_pids(2)
    assert len(two) == 2  # the one that saved, and a spare
    starters, start = [], encoder_process.EncoderProcess
    monkeypatch.setattr(encoder_process, "EncoderProcess",
                        lambda: starters.append(threading.current_thread().name) or start())
    _saves_at_once(tmp_path, "b", 2, 30)
    assert _idle_pids(3) > two  # both saves took a waiting helper; taking the last one started the next spare
    assert starters == ["ltx25-spare-encoder"]


def test_a_save_waits_for_the_spare_being_started_instead_of_starting_another(monkeypatch):
    monkeypatch.setattr(encoder_process, "SPARES", 1)
    starters, start = [], encoder_process.EncoderProcess

    def slow_start():  # spares start slowly: the second save comes while the first spare is starting
        starters.append(threading.current_thread().name)
        time.sleep(0.5 if starters[-1] != "MainThread" else 0)
        return start()

    monkeypatch.setattr(encoder_process, "EncoderProcess", slow_start)
    first = encoder_process._take()  # none idle, none starting: one for this save, and a spare
    second = encoder_process._take()  # the spare, waited for; taking it starts the next spare
    for helper in (first, second):
        encoder_process._give_back(helper)
    encoder_process.close_helpers()  # waits for the spares being started
    assert first is not second and sorted(starters) == ["MainThread"] + ["ltx25-spare-encoder"] * 2


@pytest.mark.parametrize("case", ["x264 refuses its settings", "the file cannot be written"])
def test_an_encode_error_in_the_helper_is_raised_here_and_the_helper_kept(tmp_path, case):
    """The encode fails early (x264 will not open: a few frames taken) or late (the first packet cannot be
    written): the helper stops taking frames, reads the rest off the pipe (more than it holds at once) and
    replies; the error is raised here and the helper, in step, takes the next save."""
    path, settings = str(tmp_path / "v.mp4"), {"crf": "not a number"}
    if case == "the file cannot be written":
        path, settings = str(tmp_path / "no such folder" / "v.mp4"), {}
    error = _failure_in_time(path, _frames(60), **settings)
    assert "crf" in str(error) or "no such folder" in str(error), error
    assert len(encoder_process._IDLE) == 1
    encoder_process.write_mp4(str(tmp_path / "next.mp4"), _frames(9), 24.0)  # the same helper, in step
    assert video_io.probe_mp4(str(tmp_path / "next.mp4")).frames == 9


def test_a_helper_that_dies_mid_save_is_reported_and_replaced(tmp_path, monkeypatch):
    encoder_process.write_mp4(str(tmp_path / "warm.mp4"), _frames(9), 24.0)
    helper = encoder_process._IDLE[0]
    order = mp4_encoder.arrival_order

    def killing(*args):
        for i, index in enumerate(order(*args)):
            if i == 2:
                helper.process.kill()
                helper.process.wait()
            yield index

    monkeypatch.setattr(mp4_encoder, "arrival_order", killing)  # the order this process sends frames in
    with pytest.raises(RuntimeError, match=r"dead\.mp4: the encoder process ended while encoding"):
        encoder_process.write_mp4(str(tmp_path / "dead.mp4"), _frames(40), 24.0)
    monkeypatch.setattr(mp4_encoder, "arrival_order", order)
    assert not encoder_process._IDLE
    encoder_process.write_mp4(str(tmp_path / "next.mp4"), _frames(9), 24.0)
    assert video_io.probe_mp4(str(tmp_path / "next.mp4")).frames == 9


def test_a_failure_mid_stream_ends_that_helper(tmp_path, monkeypatch):
    """The helper waits for frames that will not come: it is ended, not given to the next save."""
    order = mp4_encoder.arrival_order

    def failing(*args):
        for i, index in enumerate(order(*args)):
            if i == 2:
                raise MemoryError("no room")
            yield index

    monkeypatch.setattr(mp4_encoder, "arrival_order", failing)
    started = []
    monkeypatch.setattr(encoder_process, "_take",
                        lambda: started.append(encoder_process.EncoderProcess()) or started[-1])
    with pytest.raises(MemoryError):
        encoder_process.write_mp4(str(tmp_path / "v.mp4"), _frames(40), 24.0)
    assert started[0].process.poll() is not None and not encoder_process._IDLE


def test_without_a_helper_the_save_is_encoded_here(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(encoder_process.sys, "executable", str(tmp_path / "no-python"))
    with caplog.at_level(logging.WARNING):
        encoder_process.write_mp4(str(tmp_path / "v.mp4"), _frames(9), 24.0)
    assert "encoding" in caplog.text and video_io.probe_mp4(str(tmp_path / "v.mp4")).frames == 9


def test_bad_frames_are_refused_before_any_helper_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(encoder_process, "_take", lambda: pytest.fail("a helper was started"))
    with pytest.raises(video_io.LTX25Error, match="image batch shape"):
        encoder_process.write_mp4(str(tmp_path / "v.mp4"), torch.rand(4, 8, 8), 24.0)


def test_frames_arrive_segment_by_segment_in_turn():
    """Each segment's x264 gets its first frame among the first that arrive, not after most of the clip."""
    order = mp4_encoder.arrival_order(121, 4)
    assert sorted(order) == list(range(121)) and order[:5] == [0, 30, 60, 91, 1]
    assert mp4_encoder.arrival_order(20, None) == list(range(20))


def test_frames_that_arrive_slowly_are_waited_for(tmp_path):
    """The helper's side (`serve`) on pipes fed one frame at a time with pauses: each segment's encoder waits for
    its frames, and the video is the one written from frames all in memory."""
    import os
    frames, here, there = _frames(36, 32, 48), str(tmp_path / "here.mp4"), str(tmp_path / "there.mp4")
    video_io.write_mp4(here, frames, 24.0, segments=3)
    job = video_io.mp4_job(frames, 24.0, segments=3)
    requests_in, requests_out = (os.fdopen(fd, mode) for fd, mode in zip(os.pipe(), ("rb", "wb")))
    replies_in, replies_out = (os.fdopen(fd, mode) for fd, mode in zip(os.pipe(), ("rb", "wb")))
    helper = threading.Thread(target=mp4_encoder.serve, args=(requests_in, replies_out), daemon=True)
    helper.start()
    try:
        assert mp4_encoder.read_message(replies_in) == "ready"
        host = video_io.host_float32(frames)
        mp4_encoder.write_message(requests_out, {**job.arguments(there), "shape": host.shape})
        for index in mp4_encoder.arrival_order(36, 3):
            requests_out.write(memoryview(host[index]).cast("B"))
            requests_out.flush()
            time.sleep(0.005)
        assert mp4_encoder.read_message(replies_in) == ("ok", None)
    finally:
        requests_out.close()  # the helper's loop ends
        helper.join(timeout=30)
    _same_video(here, there)


def test_a_helper_holds_a_few_frames_not_the_clip():
    """Frames wait to be taken up to `room` of them; the pipe holds the rest back. Each is handed over once."""
    import io
    clip = np.random.default_rng(0).random((20, 4, 6, 3), dtype=np.float32)
    arriving = mp4_encoder._Arriving(clip.shape, room=3)
    reader = threading.Thread(target=arriving.receive, args=(io.BytesIO(clip.tobytes()), list(range(20))))
    reader.start()
    time.sleep(0.2)
    assert len(arriving._waiting) == 3 and reader.is_alive()
    assert all(np.array_equal(arriving[i], clip[i]) for i in range(20))
    reader.join(timeout=10)
    assert not reader.is_alive() and not arriving._waiting


def test_a_segment_that_fails_does_not_leave_the_others_waiting(tmp_path):
    """400 frames in 4 segments; the first segment's packets cannot be written, so it stops taking frames while
    the others still want theirs: its untaken frames must not fill the helper's room and starve them."""
    error = _failure_in_time(str(tmp_path / "no such folder" / "v.mp4"), _frames(400, 16, 16), segments=4)
    assert "no such folder" in str(error), error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shell script stands in for the interpreter")
def test_an_interpreter_that_never_answers_is_given_up_on(tmp_path, monkeypatch, caplog):
    """sys.executable is not always a Python that runs `-c` (an embedding app): a helper that does not say it is
    ready in time is ended, and the save is encoded here."""
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    monkeypatch.setattr(encoder_process.sys, "executable", str(silent))
    monkeypatch.setattr(encoder_process, "READY_TIMEOUT_S", 1.0)
    with caplog.at_level(logging.WARNING):
        encoder_process.write_mp4(str(tmp_path / "v.mp4"), _frames(9), 24.0)
    assert "no answer" in caplog.text and video_io.probe_mp4(str(tmp_path / "v.mp4")).frames == 9
