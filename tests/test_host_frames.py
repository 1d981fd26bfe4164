"""The decoders' host output buffer: pages touched on a background thread while the GPU works."""
from __future__ import annotations

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
