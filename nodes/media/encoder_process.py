"""Saves encoded in helper processes, so that the graph's threads keep the GIL.

An encode's threads (each segment's x264 feeder, its yuv converter, the muxer) take the GIL for every frame, and
every torch call of the graph's thread gives it up and must win it back: beside two saves encoding on threads of
its process the compare node ran several times slower than beside the same saves in two other processes
(bench/bench_compare.py, docs/PERFORMANCE.md). So a save writes its float
frames, as they are, into a pipe to a helper process running `mp4_encoder` (the writes hold no GIL), which converts
and encodes them as they arrive, `background.NICE` below this process. Helpers are kept for the next saves (one
per save running at once) and end when this process closes their pipe or exits.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import subprocess
import sys
import threading

import torch

from . import background
from . import mp4_encoder
from . import video_io
from .video_io import Mp4Job, host_float32, mp4_job

log = logging.getLogger(__name__)
MAX_IDLE = 4  # helpers kept waiting for the next save (the A/B graph runs three saves at once)
SPARES = 1  # helpers started ahead: a save that finds the last idle one starts the next one for the save after it
READY_TIMEOUT_S = 60.0  # a helper imports PyAV and numpy, seconds on a cold disk; something else never answers
_PIPE_BYTES = 1 << 20  # Linux's largest unprivileged pipe buffer: fewer wake-ups per frame than the default 64 KiB
# Loaded by path under a name of its own: neither this package nor its folder goes on the helper's sys.path.
_BOOT = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ltx25_mp4_encoder', sys.argv[1]); "
         "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); module.main()")


class EncoderProcess:
    """One helper process; `encode` sends it a save and waits for its reply."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _BOOT, mp4_encoder.__file__, str(background.NICE)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            with contextlib.suppress(ImportError, AttributeError, OSError):  # not Linux (Windows has no fcntl)
                import fcntl
                fcntl.fcntl(self.process.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
            ready: list = []  # read on a thread: a wait with a timeout that works on any platform's pipes

            def greet() -> None:
                try:
                    ready.append(mp4_encoder.read_message(self.process.stdout))
                except Exception as error:  # noqa: BLE001 - not our helper talking (an unpicklable answer)
                    ready.append(error)

            greeting = threading.Thread(target=greet, daemon=True)
            greeting.start()
            greeting.join(READY_TIMEOUT_S)
            if ready != ["ready"]:
                answer = "no answer" if not ready else f"exit code {self.process.poll()}" if ready[0] is None \
                    else repr(ready[0])
                raise RuntimeError(f"the encoder process ({sys.executable}) did not start: {answer}")
        except BaseException:
            self.close(kill=True)
            raise

    def encode(self, path: str, frames: torch.Tensor, job: Mp4Job) -> tuple[str, str | None] | None:
        """Send one save and return the helper's reply, or None if it died."""
        try:
            host = host_float32(frames)
            mp4_encoder.write_message(self.process.stdin, {**job.arguments(path), "shape": host.shape})
            for index in mp4_encoder.arrival_order(host.shape[0], job.segments):
                self.process.stdin.write(memoryview(host[index]).cast("B"))
            self.process.stdin.flush()
            return mp4_encoder.read_message(self.process.stdout)
        except (BrokenPipeError, ConnectionResetError):
            return None

    def close(self, kill: bool = False) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # its loop ends at the end of its input
        if kill:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.process.stdout.close()


_IDLE: list[EncoderProcess] = []  # waiting for the next save
_STARTING: list[threading.Thread] = []  # starting spares
_LOCK = threading.Lock()


def _take() -> EncoderProcess:
    """An idle helper, else the spare being started, else a new one. When no helper is left idle, a spare starts in
    the background: starting one (Python, numpy, PyAV) costs CPU, and one started for a save that begins while others
    encode (the A/B graph's third) made the first warm run the slowest."""
    while True:
        helper = None
        with _LOCK:
            while _IDLE and helper is None:
                helper = _IDLE.pop()
                if helper.process.poll() is not None:
                    helper = None
            starting = list(_STARTING)
            if (helper is not None or not starting) and len(_IDLE) + len(_STARTING) < SPARES:
                _STARTING.append(threading.Thread(target=_start_spare, daemon=True, name="ltx25-spare-encoder"))
                _STARTING[-1].start()
        if helper is not None:
            return helper
        if not starting:
            return EncoderProcess()
        for thread in starting:  # sooner ready than one started now, and no second start beside the encodes
            thread.join(READY_TIMEOUT_S)


def _start_spare() -> None:
    try:
        _give_back(EncoderProcess())
    except (OSError, RuntimeError) as error:  # the save that needs one will say so (and encode here)
        log.debug("LTX-2.5 save: no spare encoder process: %s", error)
    finally:
        with _LOCK:
            _STARTING.remove(threading.current_thread())


def _give_back(helper: EncoderProcess) -> None:
    with _LOCK:
        if len(_IDLE) < MAX_IDLE:
            _IDLE.append(helper)
            return
    helper.close()


@atexit.register
def close_helpers() -> None:
    """End the idle helpers (at exit; after the interpreter has waited for the saves' threads), spares included."""
    with _LOCK:
        starting = list(_STARTING)
    for thread in starting:
        thread.join(READY_TIMEOUT_S)
    with _LOCK:
        helpers = list(_IDLE)
        _IDLE.clear()
    for helper in helpers:
        helper.close()


def write_mp4(path: str, frames: torch.Tensor, fps: float, audio: torch.Tensor | None = None,
              sample_rate: int = 48000, metadata: dict[str, str] | None = None, crf: int = 17,
              segments: int | None = None) -> str:
    """`video_io.write_mp4`, encoded by a helper process; in this process if none can be started."""
    job = mp4_job(frames, fps, audio, sample_rate, metadata, crf, segments)  # bad input fails here, named
    try:
        helper = _take()
    except (OSError, RuntimeError) as error:
        log.warning("LTX-2.5 save: no encoder process (%s); encoding %s in this process", error, path)
        return video_io.write_job(path, frames, job)
    try:
        reply = helper.encode(path, frames, job)
    except BaseException:  # failed mid-stream: the helper waits for frames that will not come
        helper.close(kill=True)
        raise
    if reply is None:
        code = helper.process.poll()
        helper.close(kill=True)
        raise RuntimeError(f"{path}: the encoder process ended while encoding (exit code {code})")
    _give_back(helper)
    status, message = reply
    if status != "ok":
        raise RuntimeError(f"{path}: {message}")
    return path
