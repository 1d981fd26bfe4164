"""The decoders' host output buffer: pages touched on a background thread while the GPU works."""
from __future__ import annotations

import contextlib

import pytest
import torch

from nodes.ltx.decode.host_frames import DirectCopy, HostFrames, host_copier


@pytest.mark.parametrize("inference", [True, False])
def test_prefaulted_buffer_is_ready_inside_and_outside_inference_mode(inference):
    """Nodes run under inference mode, which is per thread: the background writer must enter it for a tensor made
    there (it once failed silently on the GPU machine, and every copy paid the page faults again)."""
    with torch.inference_mode(inference):
        frames = HostFrames((3, 64, 64, 3), prefault=True)
        out = frames.ready()
        assert out.is_inference() == inference
        assert out.shape == (3, 64, 64, 3) and out.dtype == torch.float32 and torch.count_nonzero(out) == 0
        out[1].fill_(0.5)  # the decoder writes into it
    assert frames.ready() is out


def test_a_failed_background_write_is_raised_not_swallowed(monkeypatch):
    frames = HostFrames((2, 2), prefault=False)
    frames._error = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        frames.ready()


def test_a_cpu_decode_copies_its_frames_directly():
    """Off CUDA (and for output kept on the device) the decoders' copier copies at once, with DeviceToHost's
    interface, so the decode loops have one path."""
    copier = host_copier(torch.device("cpu"))
    assert isinstance(copier, DirectCopy)
    dst, src = torch.zeros(2, 3), torch.arange(6.0).view(2, 3)
    copier.copy(dst, src)
    copier.finish_moves()
    copier.finish()
    assert torch.equal(dst, src)


class _Stream:
    def wait_stream(self, other) -> None:
        pass


class _Event:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


def test_staged_pieces_add_into_the_frames_and_then_work_runs_after_them(monkeypatch):
    """`DeviceToHost` as on a GPU, with CUDA's stream, events and pinned memory stood in for by CPU ones (the
    staging buffers, chunking and mover thread are its own): pieces handed over with `accumulate` are added into
    the frames, in chunks smaller than a piece; `then` work runs after every piece handed over before it and
    before those after it (a tiled diffusion decode maps its final frames to [0, 1] that way); a failure of that
    work is raised by `finish()`, not lost on the mover thread."""
    from nodes.ltx.decode import host_frames

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(host_frames, "_pinned", lambda size: torch.empty(size, dtype=torch.uint8))
    monkeypatch.setattr(host_frames.DeviceToHost, "_staging", {})
    with torch.inference_mode():
        out, tile = torch.zeros(10, 4), torch.arange(40.0).view(10, 4)
        copier = host_frames.DeviceToHost(torch.device("cpu"), chunk_bytes=3 * 4 * 4)  # 3 rows per chunk
        copier.copy(out, tile, accumulate=True)
        copier.copy(out[2:9], torch.ones(7, 4), accumulate=True)
        seen = []
        copier.then(lambda: seen.append(out.clone()))
        copier.copy(out[:1], torch.full((1, 4), -1.0))
        copier.finish()
        want = tile.clone()
        want[2:9] += 1
        assert torch.equal(seen[0], want)
        want[0] = -1.0
        assert torch.equal(out, want)
        failing = host_frames.DeviceToHost(torch.device("cpu"))
        failing.then(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.finish()
