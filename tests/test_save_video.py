"""Saving video with sound (PyAV): the mp4 decodes back with the right frames, fps, size, audio and metadata; names
never overwrite, stay inside the output folder and are shared by a run's saves; a save stopped anyhow (an error, an
interrupt, a cancelled run, a signal) leaves no file under a final name; the node's UI/result contract."""
from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import av
import numpy as np
import pytest
import torch

from nodes.comfy import bridge
from nodes.comfy.output import LTX25SaveVideo
from nodes.ltx.errors import LTX25Error
from nodes.media import mp4

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(bridge.folders, "_output_dir_override", str(tmp_path))
    return tmp_path


def _save(*args, **kwargs):
    """The node's save is a coroutine (ComfyUI runs it as a task): run it to the end."""
    return asyncio.run(LTX25SaveVideo().save(*args, **kwargs))


def _frames(count=25, height=64, width=96, seed=0):
    return torch.rand(count, height, width, 3, generator=torch.Generator().manual_seed(seed))


def _tone(seconds, rate=48000):
    t = torch.arange(round(seconds * rate)) / rate
    return torch.stack([torch.sin(2 * math.pi * 440 * t), torch.sin(2 * math.pi * 660 * t)]) * 0.3


def _slow_frames(monkeypatch, seconds_per_frame=0.02) -> list[int]:
    """Each frame's conversion made slow, so a test can act while a save is under way; returns the frames converted."""
    converted, picture = [], mp4._picture

    def slow(frames, index):
        time.sleep(seconds_per_frame)
        converted.append(index)
        return picture(frames, index)

    monkeypatch.setattr(mp4, "_picture", slow)
    return converted


async def _part_appears(folder, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not list(folder.glob("*.part")):
        assert time.monotonic() < deadline, "the save never started writing"
        await asyncio.sleep(0.005)


def test_saved_mp4_decodes_back_with_frames_fps_size_audio_and_metadata(output_dir):
    """25 frames of 96×64 at 24 fps with a stereo track of 1 s: the file has 25 frames, 24 fps, 96×64, 2 channels
    at 48 kHz lasting 25/24 s (the track is fitted to the video; AAC rounds up to whole 1024-sample frames, so the
    decoded track is at most one AAC frame longer, never shorter), and the run metadata JSON in its tags."""
    info = {"prompt": "a fox", "seed": 7, "decoder": "conv", "seconds": 1.5}
    result = _save(_frames(), 24.0, "LTX25", {"waveform": _tone(1.0)[None], "sample_rate": 48000}, json.dumps(info))
    probe = mp4.probe_mp4(result["result"][0])
    assert (probe.frames, probe.fps, probe.width, probe.height) == (25, 24.0, 96, 64)
    assert (probe.audio_channels, probe.sample_rate) == (2, 48000)
    assert 0 <= probe.audio_samples - 25 / 24 * 48000 < 1024, probe.audio_samples
    assert json.loads(probe.metadata["comment"]) == info


def test_fps_zero_takes_the_frame_rate_of_the_latent(output_dir):
    """fps 0 (the default) saves at the frame rate the latent carries, so the file plays at the speed the clip was
    made for; a typed fps overrides it; fps 0 with no latent is refused by name instead of guessing."""
    latent = {"samples": torch.zeros(1, 128, 2, 2, 3), "frame_rate": 25.0}
    assert LTX25SaveVideo.INPUT_TYPES()["required"]["fps"][1]["default"] == 0.0
    from_latent = _save(_frames(10), 0.0, "rate", latent=latent)["result"][0]
    overridden = _save(_frames(10), 30.0, "rate", latent=latent)["result"][0]
    assert mp4.probe_mp4(from_latent).fps == 25.0 and mp4.probe_mp4(overridden).fps == 30.0
    with pytest.raises(LTX25Error, match=r"LTX25SaveVideo\.fps"):
        _save(_frames(10), 0.0, "rate")


def test_audio_and_video_lengths_that_disagree_are_logged(output_dir, caplog):
    """A 2 s track on 1 s of video (audio from another clip, or the wrong fps) is fitted and logged; the audio
    VAE's own shortfall (tens of milliseconds) is not."""
    with caplog.at_level("WARNING", logger="nodes.media.mp4"):
        _save(_frames(24), 24.0, "short", {"waveform": _tone(0.97)[None], "sample_rate": 48000})
        assert not caplog.records, caplog.text
        _save(_frames(24), 24.0, "long", {"waveform": _tone(2.0)[None], "sample_rate": 48000})
    assert "the audio lasts 2.000 s and the video 1.000 s" in caplog.text, caplog.text


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


def test_a_runs_saves_share_one_counter_and_runs_saving_at_once_do_not_interleave(output_dir):
    """Two runs saving into one folder, their saves interleaved, with one prefix's counters ahead of another's:
    each run's files carry one counter (conv/diffusion/side by side of a run pair up by name), the runs get two
    different ones, and a save outside any run (no prompt) takes the next free one."""
    (output_dir / "diffusion_00004_.mp4").write_bytes(b"an older run")
    run_a, run_b = {"run": "a"}, {"run": "b"}  # the PROMPT dicts: one per run, the same for all of a run's nodes
    saved = {}
    for prompt, prefix in ((run_a, "conv"), (run_b, "conv"), (run_b, "diffusion"), (run_a, "diffusion"),
                           (run_a, "side"), (None, "loose")):
        path = _save(_frames(9), 24.0, prefix, prompt=prompt)["result"][0]
        saved[(prompt or {}).get("run"), prefix] = os.path.basename(path)
    assert saved == {("a", "conv"): "conv_00005_.mp4", ("b", "conv"): "conv_00006_.mp4",
                     ("b", "diffusion"): "diffusion_00006_.mp4", ("a", "diffusion"): "diffusion_00005_.mp4",
                     ("a", "side"): "side_00005_.mp4", (None, "loose"): "loose_00007_.mp4"}, saved


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
    probe = mp4.probe_mp4(path)
    assert (probe.width, probe.height, probe.frames) == (48, 34, 9)
    with av.open(path) as container:
        first = next(iter(container.decode(video=0))).to_ndarray(format="rgb24")
    assert first[16, -2:].min() > 200 and first[-2:, 20].min() > 200, (first[16, -3:], first[-3:, 20])


def test_prefix_outside_the_output_folder_is_refused(output_dir):
    """A prefix with '..' or an absolute path cannot write outside the output folder."""
    for prefix in ("../escape", "/tmp/escape"):
        with pytest.raises(LTX25Error, match="filename prefix"):
            _save(_frames(9), 24.0, prefix)


def test_a_symlink_inside_the_output_folder_cannot_lead_outside(output_dir, tmp_path_factory):
    """A link in the output folder to another folder: a prefix through it is refused (paths are resolved, links
    included, before the check), and nothing is written where it points."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    os.symlink(elsewhere, output_dir / "link")
    with pytest.raises(LTX25Error, match="filename prefix"):
        _save(_frames(9), 24.0, "link/escape")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("prefix, hint", [("nul\0byte", "NUL"), ("x" * 300, "Shorten"), ("y" * 300 + "/v", "Shorten")])
def test_a_prefix_no_file_system_takes_is_a_named_error(output_dir, prefix, hint):
    """A NUL byte or a name longer than the file system allows (in the file name or a subfolder) is an LTX25Error
    naming the node's filename_prefix input and what to do, not a bare ValueError or OSError from inside os."""
    with pytest.raises(LTX25Error, match=r"LTX25SaveVideo\.filename_prefix") as error:
        _save(_frames(9), 24.0, prefix)
    assert hint in str(error.value) and list(output_dir.iterdir()) == []


def test_batch_audio_is_fitted_per_clip(output_dir):
    """Two clips decoded as a batch (frames one after the other) with two waveforms of slightly different
    lengths: each track is fitted to its clip, so the file's audio lasts exactly the video's 2·9/24 s."""
    audio = torch.stack([_tone(0.35), _tone(0.35)])[:, :, :16000]
    path = _save(_frames(18), 24.0, "batch", {"waveform": audio, "sample_rate": 48000})["result"][0]
    probe = mp4.probe_mp4(path)
    assert probe.frames == 18 and 0 <= probe.audio_samples - 18 / 24 * 48000 < 1024, probe.audio_samples


def test_decoded_audio_and_video_end_together(tiny_file, output_dir):
    """The tiny audio VAE's output (10–50 ms shorter than F/fps by construction) muxed with 17 frames at 24 fps:
    both streams of the file last 17/24 s."""
    from nodes.ltx import audio_vae
    vae = audio_vae.load_audio_vae(tiny_file("audio_vae"), torch.float32)
    audio = audio_vae.decode_audio(vae, torch.randn(1, 8, 18, 16), fps=24.0)
    assert audio["waveform"].shape[-1] < round(17 / 24 * 48000)
    path = _save(_frames(17), 24.0, "av", audio)["result"][0]
    probe = mp4.probe_mp4(path)
    assert probe.frames == 17 and 0 <= probe.audio_samples - 17 / 24 * 48000 < 1024, probe.audio_samples


def test_save_runs_on_a_worker_thread_so_the_next_node_can_go_on(output_dir, monkeypatch):
    """The save is a coroutine whose encode runs on another thread: while it encodes, the event loop (ComfyUI's
    executor) is free — a ticker on the loop advances during the save. A plain function would block the loop."""
    assert asyncio.iscoroutinefunction(LTX25SaveVideo.save)
    encoder_threads, original = set(), mp4.save_mp4

    def spy(*args, **kwargs):
        encoder_threads.add(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(mp4, "save_mp4", spy)

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

    path, ticks = asyncio.run(main())
    assert encoder_threads and threading.get_ident() not in encoder_threads
    assert ticks > 3 and mp4.probe_mp4(path).frames == 49


def test_a_failed_encode_leaves_no_file(output_dir, monkeypatch):
    """A save that fails mid-encode removes its partial file: the folder is empty, no final name, no `.part`."""
    picture = mp4._picture

    def broken(frames, index):
        if index == 5:
            raise RuntimeError("encoder died")
        return picture(frames, index)

    monkeypatch.setattr(mp4, "_picture", broken)
    with pytest.raises(RuntimeError, match="encoder died"):
        _save(_frames(20), 24.0, "gone")
    assert list(output_dir.iterdir()) == []


def test_an_output_folder_that_cannot_be_made_is_named_as_the_folder_not_the_prefix(output_dir):
    """A file where the prefix's subfolder should be (or a read-only output folder) is the folder's problem: the
    error names the folder and where to look, rather than calling a good prefix a name the file system cannot take."""
    (output_dir / "clips").write_text("a file, not a folder")
    with pytest.raises(LTX25Error, match="the output folder is .*clips.*--output-directory") as error:
        _save(_frames(9), 24.0, "clips/t")
    assert error.value.where == "LTX25SaveVideo.filename_prefix" and "filename prefix is" not in str(error.value)


@pytest.mark.parametrize("prefix, expected", [
    ("../outside/t", "a name inside"),
    ("clips/t", "clips is a file, not a folder"),
    ("clips/deeper/t", "clips is a file, not a folder"),
])
def test_a_prefix_that_cannot_be_saved_is_refused_when_the_run_is_queued(output_dir, prefix, expected):
    """The node's VALIDATE_INPUTS (ComfyUI calls it when a prompt is queued, the headless runner before its first
    node) refuses what the save could never write — before minutes of sampling, not after the decode — and
    writes nothing while checking. A good prefix, a subfolder still to be made, and a linked prefix (None: known
    only at run time) pass. Fails if the checks wait for the save or create folders."""
    (output_dir / "clips").write_text("a file, not a folder")
    verdict = LTX25SaveVideo.VALIDATE_INPUTS(filename_prefix=prefix)
    assert isinstance(verdict, str) and expected in verdict and "LTX25SaveVideo.filename_prefix" in verdict, verdict
    for good in ("LTX25", "new/sub/folder/t", None):
        assert LTX25SaveVideo.VALIDATE_INPUTS(filename_prefix=good) is True
    assert sorted(p.name for p in output_dir.iterdir()) == ["clips"]


def test_the_headless_runner_refuses_a_save_prefix_before_running_any_node(output_dir, monkeypatch):
    """graph.validate calls a node's VALIDATE_INPUTS with the inputs its signature names, a linked one as None, as
    ComfyUI's validate_prompt does: a run with a save that could never write stops before its first node, naming
    the node and the input; a linked prefix is left to run time."""
    from nodes.tools import graph, run

    class Frames:
        RETURN_TYPES = ("IMAGE",)
        FUNCTION = "make"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        def make(self):
            ran.append("frames")
            return (torch.zeros(1, 8, 8, 3),)
    ran: list[str] = []
    classes = {"Frames": Frames, "LTX25SaveVideo": LTX25SaveVideo}
    prompt = {"1": {"class_type": "Frames", "inputs": {}},
              "2": {"class_type": "LTX25SaveVideo", "inputs": {"images": ["1", 0], "fps": 24.0,
                                                               "filename_prefix": "../escape/t"}}}
    with pytest.raises(graph.GraphError, match=r"node 2 \(LTX25SaveVideo\) input 'filename_prefix': .*a name inside"):
        run.execute(prompt, classes)
    assert ran == []
    prompt["2"]["inputs"]["filename_prefix"] = ["1", 0]  # linked: not a STRING output, but validate only sees a link
    monkeypatch.setattr(graph, "_check_link", lambda *args: None)
    graph.validate(prompt, classes)


def test_a_disk_that_fills_mid_save_is_a_named_error_and_leaves_no_file(output_dir, monkeypatch):
    """ENOSPC from the encoder becomes an error naming the node and what to do; the partial file is removed."""
    import errno

    def full(path, *args):
        with open(path, "wb") as part:
            part.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(mp4, "_encode", full)
    with pytest.raises(LTX25Error, match="No space left on device. Free disk space") as error:
        _save(_frames(9), 24.0, "full")
    assert error.value.where == "LTX25SaveVideo" and list(output_dir.iterdir()) == []


def test_an_interrupt_stops_the_save_and_leaves_no_file(output_dir, monkeypatch):
    """The user's interrupt (ComfyUI's cancel button: bridge.check_interrupt) reaches a save while it encodes: it
    stops within a frame or two with ComfyUI's interrupt exception, and its partial file is gone."""
    converted = _slow_frames(monkeypatch)

    async def main():
        task = asyncio.ensure_future(LTX25SaveVideo().save(_frames(200, 32, 32), 24.0, "interrupted"))
        await _part_appears(output_dir)
        bridge.request_interrupt()
        with pytest.raises(bridge.InterruptError):
            await task

    try:
        asyncio.run(main())
    finally:
        bridge.interrupts._interrupt_requested = False  # a save that missed it must not stop a later test
    assert list(output_dir.iterdir()) == [] and len(converted) < 100, len(converted)


def test_a_cancelled_run_stops_the_save_and_leaves_no_file(output_dir, monkeypatch):
    """When the run stops while a save encodes (a later node failed, the user cancelled: the executor cancels the
    task), the encode stops at its next frame instead of running on, and removes its partial file: no file is
    left under a final name, cut off or not."""
    converted = _slow_frames(monkeypatch)

    async def run_then_fail():
        asyncio.ensure_future(LTX25SaveVideo().save(_frames(200, 32, 32), 24.0, "stopped"))
        await _part_appears(output_dir)
        raise RuntimeError("a later node failed")

    with pytest.raises(RuntimeError, match="later node failed"):
        asyncio.run(run_then_fail())  # cancels the pending save, then waits for the executor's threads
    assert list(output_dir.iterdir()) == [] and len(converted) < 100, len(converted)


def test_a_save_cancelled_before_a_thread_took_its_encode_leaves_no_file(output_dir):
    """A run stopped just after a save started: the save has reserved its name (the part file) and queued its
    encode, which no thread has taken yet (here the loop's only worker is busy), so cancelling the task drops the
    encode before it ever runs. The save removes the part itself; without that a `.part` was left behind (seen when
    an interrupt came at the A/B graph's diffusion save)."""
    from concurrent.futures import ThreadPoolExecutor

    async def stop_before_the_encode_starts():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        gate = threading.Event()
        busy = asyncio.get_running_loop().run_in_executor(None, gate.wait)
        save = asyncio.ensure_future(LTX25SaveVideo().save(_frames(5, 32, 32), 24.0, "queued"))
        await _part_appears(output_dir)
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save
        gate.set()
        await busy

    asyncio.run(stop_before_the_encode_starts())
    assert list(output_dir.iterdir()) == []


_KILLED_RUN = textwrap.dedent("""
    import signal, sys, time
    import torch
    from nodes.comfy.output import LTX25SaveVideo
    from nodes.media import mp4
    from nodes.tools import run

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may inherit SIGINT ignored
    picture = mp4._picture
    mp4._picture = lambda frames, index: time.sleep(0.02) or picture(frames, index)  # a save that takes seconds

    class Frames:
        RETURN_TYPES = ("IMAGE",)
        FUNCTION = "make"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        def make(self):
            return (torch.rand(400, 32, 32, 3),)

    run.NODE_CLASS_MAPPINGS = {"Frames": Frames, "LTX25SaveVideo": LTX25SaveVideo}
    raise SystemExit(run.main(sys.argv[1:]))
""")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_headless_run_stopped_mid_save_leaves_no_file_under_a_final_name(tmp_path, stop):
    """`python -m nodes.tools.run` stopped by Ctrl-C, SIGTERM or SIGKILL while a save encodes: the output folder
    holds no `*.mp4`. Ctrl-C and SIGTERM end the run with status 130 and remove the partial file as well; after
    SIGKILL (which nothing can catch) only the `.part` is left, which no player or viewer takes for a video."""
    out = tmp_path / "out"
    script, prompt = tmp_path / "killed_run.py", tmp_path / "prompt.json"
    script.write_text(_KILLED_RUN)
    prompt.write_text(json.dumps({
        "1": {"class_type": "Frames", "inputs": {}},
        "2": {"class_type": "LTX25SaveVideo", "inputs": {"images": ["1", 0], "fps": 24.0, "filename_prefix": "v"}}}))
    env = {**os.environ, "PYTHONPATH": ROOT}
    process = subprocess.Popen([sys.executable, str(script), str(prompt), "--models", str(tmp_path), "--out",
                                str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not (list(out.glob("*.part")) and list(out.glob("*.part"))[0].stat().st_size):
            assert process.poll() is None, process.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the save never started"
            time.sleep(0.01)
        process.send_signal(stop)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert list(out.glob("*.mp4")) == [], sorted(p.name for p in out.iterdir())
    if stop != signal.SIGKILL:
        assert process.returncode == 130, err.decode()[-3000:]
        assert list(out.iterdir()) == [], sorted(p.name for p in out.iterdir())


def test_headless_saves_carry_the_prompt_and_workflow_like_comfyuis(output_dir):
    """The headless runner hands the save ComfyUI's hidden inputs: the file's tags hold the run's API prompt (so
    its seed) and the UI workflow, as files saved inside ComfyUI do."""
    from nodes.tools import run

    class Frames:
        RETURN_TYPES = ("IMAGE",)
        FUNCTION = "make"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"seed": ("INT", {"default": 0})}}

        def make(self, seed):
            return (_frames(9, seed=seed),)

    prompt = {"1": {"class_type": "Frames", "inputs": {"seed": 1234}},
              "2": {"class_type": "LTX25SaveVideo", "inputs": {"images": ["1", 0], "fps": 24.0,
                                                                "filename_prefix": "headless"}}}
    workflow = {"nodes": [], "links": [], "version": 0.4}
    result = run.execute(prompt, {"Frames": Frames, "LTX25SaveVideo": LTX25SaveVideo},
                         extra_pnginfo={"workflow": workflow})
    tags = mp4.probe_mp4(result["outputs"]["2"][0]).metadata
    assert json.loads(tags["prompt"]) == prompt and json.loads(tags["prompt"])["1"]["inputs"]["seed"] == 1234
    assert json.loads(tags["workflow"]) == workflow


def test_colours_come_back_from_the_file(output_dir):
    """Frames are [0, 1] RGB and the file's colours are what decoders assume: flat frames of eight colours, saved
    and decoded back to RGB by PyAV, keep their colour within 3/255 (yuv420p at crf 17, libswscale's integer
    conversions both ways), and a horizontal gradient keeps its values."""
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


@pytest.mark.parametrize("fps", [24.0, 24000 / 1001])
def test_every_frame_is_saved_once_in_order(tmp_path, fps):
    """Frames converted ahead on a helper thread still reach x264 in order: each frame's own flat brightness comes
    back in its place, at an NTSC rate and an odd size too, with the audio muxed beside."""
    count = 61
    level = torch.linspace(0.05, 0.95, count)
    frames = (torch.rand(count, 47, 66, 3, generator=torch.Generator().manual_seed(1)) * 0.04
              + level[:, None, None, None])
    path = mp4.save_mp4(mp4.reserve(str(tmp_path), "order"), frames.numpy(), fps, _tone(count / fps).numpy())
    with av.open(path) as container:
        means = [float(f.to_ndarray(format="rgb24").mean()) / 255 for f in container.decode(video=0)]
    assert len(means) == count
    assert max(abs(m - float(v) - 0.02) for m, v in zip(means, level)) < 0.02
    probe = mp4.probe_mp4(path)
    assert (probe.width, probe.height, probe.audio_channels) == (66, 48, 2)
    assert abs(probe.fps - fps) < 1e-6 * fps, probe.fps


def test_inference_tensors_save(output_dir):
    """ComfyUI hands the save inference tensors (its executor runs in inference mode, which is per thread): the
    node reads them as it is called — odd sizes (padded) and audio included."""
    with torch.inference_mode():
        frames, waveform = torch.rand(9, 33, 47, 3), torch.rand(1, 2, 20000) - 0.5
        path = _save(frames, 24.0, "inference", {"waveform": waveform, "sample_rate": 48000})["result"][0]
    probe = mp4.probe_mp4(path)
    assert (probe.frames, probe.width, probe.height, probe.audio_channels) == (9, 48, 34, 2)


def test_the_audio_is_encoded_beside_the_video_not_after_it(tmp_path, monkeypatch):
    """The AAC encode runs on a thread of its own beside x264 (after the video it was the save's serial tail): the
    last frame is handed over only once the audio is encoded, which works only if the audio does not wait for the
    video; the file still holds both, whole."""
    audio_done, encode_audio = threading.Event(), mp4._encode_audio

    def encode_then_tell(*args):
        packets = encode_audio(*args)
        audio_done.set()
        return packets

    class LastFrameAfterTheAudio:
        def __init__(self, frames: np.ndarray) -> None:
            self.frames, self.shape, self.ndim = frames, frames.shape, frames.ndim

        def __getitem__(self, index: int) -> np.ndarray:
            if index == self.shape[0] - 1:
                assert audio_done.wait(10), "the audio waited for the video's last frame"
            return self.frames[index]

    monkeypatch.setattr(mp4, "_encode_audio", encode_then_tell)
    path = mp4.save_mp4(mp4.reserve(str(tmp_path), "a"), LastFrameAfterTheAudio(_frames(48).numpy()), 24.0,
                        _tone(2.0).numpy())
    with av.open(path) as container:
        video, sound = container.streams.video[0], container.streams.audio[0]
        assert video.frames == 48 and abs(float(sound.duration * sound.time_base) - 2.0) < 0.05


def test_the_demos_report_is_named_with_its_run_and_never_overwritten(tmp_path):
    """The demo's A/B report takes the counter its run's videos share, and a second report of the same counter
    (another run reusing the folder) gets a name of its own instead of replacing the first."""
    from nodes.tools import demo
    videos = [str(tmp_path / f"ltx25_ab_{side}_00003_.mp4") for side in ("conv", "diffusion", "side_by_side")]
    assert demo.run_counter(videos) == 3
    first = demo.write_report(str(tmp_path), '{"run": 1}', 3)
    second = demo.write_report(str(tmp_path), '{"run": 2}', 3)
    assert os.path.basename(first) == "decoder_ab_report_00003_.json" and second != first
    assert json.load(open(first)) == {"run": 1} and json.load(open(second)) == {"run": 2}


def test_the_save_module_imports_alone_without_torch():
    """nodes.media.mp4 needs only PyAV, numpy and the standard library (and the pack's error type): scripts can
    save or probe mp4s without loading torch or any engine or ComfyUI-facing module."""
    code = ("import sys, nodes.media.mp4; "
            "print(sorted(m for m in sys.modules if m.startswith(('nodes', 'torch', 'diffusers', 'transformers'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["nodes", "nodes.ltx", "nodes.ltx.errors", "nodes.media", "nodes.media.mp4",
                         "nodes.media.output_folder"], out
