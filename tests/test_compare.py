"""The decoder A/B compare node: PSNR/SSIM figures, the labelled canvas and mismatch errors."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch

from nodes.comfy import previews
from nodes.comfy.compare import LTX25DecoderCompare
from nodes.ltx.decode.stats import DecodeStats
from nodes.ltx.decode import compare as image_compare
from nodes.ltx.errors import LTX25Error
from nodes.ltx.decode.compare import psnr_and_ssim_per_frame


def run_compare(*args, **kwargs):
    """The compare node's coroutine, run to its end."""
    return asyncio.run(LTX25DecoderCompare().compare(*args, **kwargs))


def frames(seed: int = 0, n: int = 3, h: int = 32, w: int = 48) -> torch.Tensor:
    return torch.rand(n, h, w, 3, generator=torch.Generator().manual_seed(seed))


def run(a, b, **kw):
    args = dict(label_a="conv", label_b="diffusion", layout="side_by_side", resize_b=False) | kw
    return run_compare(a, b, **args)["result"]


def test_identical_inputs_report_infinite_psnr_and_unit_ssim():
    a = frames()
    _canvas, text = run(a, a.clone())
    report = json.loads(text)
    assert report["psnr_mean_db"] == "inf" and abs(report["ssim_mean"] - 1.0) < 1e-12, report


def test_perturbed_input_lowers_psnr_and_ssim_monotonically():
    """More noise must mean lower figures, or the metrics measure nothing."""
    a = frames()
    g = torch.Generator().manual_seed(1)
    small = (a + 0.01 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    large = (a + 0.1 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    p_small, p_large = json.loads(run(a, small)[1]), json.loads(run(a, large)[1])
    psnr_small, psnr_large = p_small["psnr_mean_db"], p_large["psnr_mean_db"]
    assert 30 < psnr_small < 60 and psnr_large < psnr_small - 10, (psnr_small, psnr_large)
    assert p_large["ssim_mean"] < p_small["ssim_mean"] < 1.0


def test_psnr_matches_its_closed_form():
    a = torch.zeros(1, 4, 4, 3)
    b = torch.full((1, 4, 4, 3), 0.1)
    assert abs(psnr_and_ssim_per_frame(a, b)[0][0] - 20.0) < 1e-5  # 10·log10(1/0.01); 0.1 is not exact in float32
    assert psnr_and_ssim_per_frame(a, a)[1][0] == pytest.approx(1.0)


def test_canvas_layouts_and_labels():
    a, b = frames(0), frames(1)
    side, _ = run(a, b)
    stacked, _ = run(a, b, layout="stacked")
    assert side.shape == (3, 32, 96, 3) and stacked.shape == (3, 64, 48, 3)
    torch.testing.assert_close(side[:, 20:, 60:], b[:, 20:, 12:], atol=0, rtol=0)  # the decode itself, unquantized
    assert not torch.allclose(side[:, :10, :30], a[:, :10, :30], atol=1 / 255)  # the label is burned in


def test_mismatched_frames_or_sizes_are_refused_unless_resize_is_asked():
    with pytest.raises(LTX25Error, match="frame count"):
        run(frames(n=3), frames(n=4))
    with pytest.raises(LTX25Error, match="resize_b"):
        run(frames(), frames(h=64, w=96))
    _, text = run(frames(), frames(h=64, w=96), resize_b=True)
    assert json.loads(text)["size"] == [48, 32]


def test_report_carries_each_decoders_costs():
    stats_a = DecodeStats("conv", 0.5, 2**30, 4, ((17, 64, 64),) * 4)
    stats_b = DecodeStats("diffusion", 1.5, 3 * 2**30, 1, ((17, 128, 128),), processor="sdpa", steps=1)
    out = run_compare(frames(), frames(2), "conv", "diffusion", "side_by_side", False, stats_a, stats_b)
    report = json.loads(out["result"][1])
    assert report["decoders"]["conv"]["tiles"] == 4 and report["decoders"]["diffusion"]["processor"] == "sdpa"
    assert report["decoders"]["diffusion"]["peak_memory_gib"] == 3.0
    assert out["ui"]["text"][0] == out["result"][1]


def test_viewer_frames_are_written_for_both_sides(tmp_path):
    """The canvas viewer reads A and B frames from the temp folder; same count on both sides."""
    from nodes.comfy import bridge as comfy_bridge
    comfy_bridge.set_output_dir(str(tmp_path))
    out = run_compare(frames(n=30), frames(1, n=30), "a", "b", "side_by_side", False)
    viewer = out["ui"]["ltx25_ab"][0]
    assert len(viewer["frames_a"]) == len(viewer["frames_b"]) == len(viewer["frame_indices"]) == 24
    previews.wait_for_previews()
    for entry in viewer["frames_a"] + viewer["frames_b"]:
        assert (tmp_path / "temp" / entry["filename"]).is_file() and entry["type"] == "temp"
    assert sorted(p.suffix for p in (tmp_path / "temp").iterdir()) == [".png"] * 48  # no half-written file left


def test_the_compare_returns_before_its_preview_frames_are_written(tmp_path, monkeypatch):
    """The side-by-side save waits for the compare's outputs, not for the viewer's PNGs: they are written on the
    previews' pool after the node returns (here held back until the node is done), each appearing whole under
    its final name."""
    import threading
    from nodes.comfy import bridge as comfy_bridge
    comfy_bridge.set_output_dir(str(tmp_path))
    release, written = threading.Event(), []
    original = previews.Image.Image.save

    def held_save(self, path, *args, **kwargs):
        release.wait(10)
        written.append(str(path))
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(previews.Image.Image, "save", held_save)
    out = run_compare(frames(n=5), frames(1, n=5), "a", "b", "side_by_side", False)
    names = [e["filename"] for e in out["ui"]["ltx25_ab"][0]["frames_a"] + out["ui"]["ltx25_ab"][0]["frames_b"]]
    assert out["result"][0].shape == (5, 32, 96, 3) and not any((tmp_path / "temp" / n).exists() for n in names)
    release.set()
    previews.wait_for_previews()
    assert all((tmp_path / "temp" / n).is_file() for n in names)
    assert sorted(written) == sorted(str(tmp_path / "temp" / n) + ".part" for n in names)  # then renamed


def test_a_headless_run_leaves_no_preview_frames_behind(tmp_path, monkeypatch):
    """`python -m nodes.tools.run` has no viewer: the compare's PNGs are deleted once written, so out/temp does not
    fill up run after run; the mp4s and the report are what a headless run keeps."""
    from nodes.tools import run

    class Frames:
        RETURN_TYPES = ("IMAGE",)
        FUNCTION = "make"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"seed": ("INT", {"default": 0})}}

        def make(self, seed):
            return (frames(seed, n=30),)

    prompt = {"1": {"class_type": "Frames", "inputs": {"seed": 0}},
              "2": {"class_type": "Frames", "inputs": {"seed": 1}},
              "3": {"class_type": "LTX25DecoderCompare", "inputs": {
                  "images_a": ["1", 0], "images_b": ["2", 0], "label_a": "a", "label_b": "b",
                  "layout": "side_by_side", "resize_b": False}}}
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(prompt))
    monkeypatch.setattr(run, "NODE_CLASS_MAPPINGS", {"Frames": Frames, "LTX25DecoderCompare": LTX25DecoderCompare})
    out = tmp_path / "out"
    assert run.main([str(path), "--models", str(tmp_path), "--out", str(out)]) == 0
    left = [p.name for p in (out / "temp").iterdir()] if (out / "temp").exists() else []
    assert left == [], left


def test_short_videos_preview_every_frame_and_long_ones_a_spread():
    """3 frames → all 3; 121 → 24 spread over the whole clip, first and last included."""
    from nodes.comfy.previews import preview_frame_indices
    assert preview_frame_indices(3) == [0, 1, 2]
    long = preview_frame_indices(121)
    assert len(long) == 24 and long[0] == 0 and long[-1] == 120


def test_equal_labels_are_refused():
    with pytest.raises(LTX25Error, match="label_b"):
        run(frames(), frames(1), label_a="x", label_b="x")


def test_canvas_made_on_a_worker_thread_keeps_the_callers_inference_mode():
    """The canvas is built on a worker thread; inside ComfyUI's executor (inference mode) it must still come back
    an inference tensor, as every other node output does, and a plain tensor outside it."""
    with torch.inference_mode():
        canvas, _ = run(frames(), frames(1))
    assert canvas.is_inference()
    canvas, _ = run(frames(), frames(1))
    assert not canvas.is_inference()


def test_a_preview_frame_that_fails_leaves_no_part_file_and_is_logged(tmp_path, monkeypatch, caplog):
    """A failed background write (disk full, say) cannot raise into the graph any more: it is logged, and neither
    its half-written `.part` file nor a final-named file is left for the viewer."""
    def broken_save(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError("disk full")

    previews.wait_for_previews()  # an earlier test's frames, still being written, must not meet the patch
    monkeypatch.setattr(previews.Image.Image, "save", broken_save)
    with caplog.at_level("WARNING"):
        names = previews.write_preview_frames(frames(n=2), str(tmp_path), "p", [0, 1])
        previews.wait_for_previews()
    assert len(names) == 2 and list(tmp_path.iterdir()) == []
    assert caplog.text.count("disk full") == 2


def test_preview_frames_of_any_float_dtype_are_written(tmp_path):
    """IMAGE batches may be half precision (or on the GPU with ComfyUI's --gpu-only): the writer converts each
    frame itself, so nothing fails unseen on the background thread."""
    names = previews.write_preview_frames(frames(n=2).to(torch.bfloat16), str(tmp_path), "p", [0, 1])
    previews.wait_for_previews()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_the_canvas_takes_both_halves_whatever_their_dtypes():
    canvas = image_compare.side_by_side(frames(n=2).half(), frames(1, n=2), "a", "b", "side_by_side")
    assert canvas.dtype == torch.float32 and canvas.shape == (2, 32, 96, 3)


def test_equal_labels_are_refused_before_any_preview_is_started(tmp_path, monkeypatch):
    from nodes.comfy import bridge as comfy_bridge
    comfy_bridge.set_output_dir(str(tmp_path))
    started = []
    monkeypatch.setattr("nodes.comfy.compare.write_preview_frames", lambda *a: started.append(a) or [])
    with pytest.raises(LTX25Error, match="label"):
        run_compare(frames(), frames(1), "same", "same", "side_by_side", False)
    assert started == []


def test_the_compare_works_off_the_calling_thread_and_stops_when_its_run_is_cancelled(monkeypatch):
    """The node is a coroutine whose metrics and canvas are computed on a worker thread, so the executor can start
    the saves beside it (tests/test_graph.py); an `async def` computing in place would hold them again. A run
    cancelled meanwhile (a later node failed) stops that work at its next check instead of letting it finish."""
    import threading
    import time
    from nodes.comfy import compare as node_module
    threads, checks, started = [], [], threading.Event()
    real_report = node_module.compare_report

    def recording_report(*args, check, **kwargs):
        threads.append(threading.get_ident())
        if len(threads) == 1:  # the first call: computed to the end
            return real_report(*args, check=check, **kwargs)
        started.set()
        for _ in range(200):  # the second: a long one, watching its check
            check()
            checks.append(1)
            time.sleep(0.005)
        return real_report(*args, check=check, **kwargs)
    monkeypatch.setattr(node_module, "compare_report", recording_report)
    run(frames(), frames(1))
    assert threads == [threads[0]] and threads[0] != threading.get_ident()

    async def cancel_while_comparing():
        task = asyncio.ensure_future(LTX25DecoderCompare().compare(frames(), frames(1), "a", "b", "side_by_side",
                                                                   False))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(cancel_while_comparing())  # returns once the worker thread is done
    assert 0 < len(checks) < 200, len(checks)
