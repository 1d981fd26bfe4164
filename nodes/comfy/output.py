"""The output node: frames + optional audio → an H.264/AAC mp4 in the output folder, never overwriting, at the frame
rate of the latent the frames were decoded from unless the user sets one."""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict

import numpy as np
import torch

from . import bridge
from ..ltx.errors import LTX25Error
from ..ltx.latents import frame_rate
from ..media.output_folder import check_writable

NODE = "LTX25SaveVideo"
RUNS_KEPT = 8  # runs whose shared counter is remembered (a run's saves follow each other closely)
_RUN_COUNTERS: OrderedDict[int, tuple[dict, int]] = OrderedDict()  # id(prompt) → (prompt, counter)


class LTX25SaveVideo:
    DESCRIPTION = "Saves frames (and audio) as an H.264/AAC mp4 in the output folder, with the run's metadata."
    CATEGORY = "LTX-2.5/output"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("path",)
    OUTPUT_TOOLTIPS = ("Full path of the saved mp4.",)
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE", {"tooltip": "Frames [F, H, W, 3] in [0, 1]; odd sizes get one repeated row/column."}),
            "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.001, "tooltip": (
                "Frame rate of the file. 0: the frame rate of `latent` (the clip the frames were decoded from); "
                "any other value overrides it.")}),
            "filename_prefix": ("STRING", {"default": "LTX25", "tooltip": (
                "File name start (may include subfolders); a counter follows, shared by the run's saves: "
                "LTX25_00001_.mp4.")})},
            "optional": {
                "audio": ("AUDIO", {"tooltip": "Waveform to mux as AAC; fitted to the video's length."}),
                "metadata": ("STRING", {"default": "", "multiline": True, "tooltip": (
                    "Run info stored in the file (JSON: prompt, seed, decoder, timings), e.g. a compare report.")}),
                "latent": ("LATENT", {"tooltip": (
                    "The video latent the frames were decoded from: its frame_rate is the file's when fps is 0.")})},
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    @classmethod
    def VALIDATE_INPUTS(cls, filename_prefix: str | None = None) -> bool | str:
        """Checked when the run is queued, before anything samples: a prefix that leaves the output folder, or a
        folder that could not be made or written, is refused then rather than after the decode (a linked prefix,
        unknown until run time, is checked when the file is reserved)."""
        if filename_prefix is None:
            return True
        try:
            check_writable(bridge.output_dir(), filename_prefix, where=f"{NODE}.filename_prefix")
        except LTX25Error as error:
            return str(error)
        return True

    async def save(self, images, fps, filename_prefix, audio=None, metadata="", latent=None, prompt=None,
                   extra_pnginfo=None):
        """A coroutine, so ComfyUI's executor runs the CPU-bound encode on a worker thread while the next nodes
        use the GPU. If the run stops meanwhile (a later node fails, the user cancels), the encode stops at its
        next frame and its partial file is removed: no file is left under a final name."""
        from ..media import mp4  # PyAV is slow to import: loaded by the first save, not with the pack
        rate = _frame_rate(fps, latent)
        frames = images.detach().to("cpu", torch.float32).contiguous().numpy()  # here: inference mode is per thread
        waveform, sample_rate = _one_track(audio, frames.shape[0], rate)
        tags = _tags(metadata, prompt, extra_pnginfo)
        name = mp4.reserve(bridge.output_dir(), filename_prefix, _run_counter(prompt), where=f"{NODE}.filename_prefix")
        _remember_run_counter(prompt, name.number)
        check = bridge.TaskCheck("the run was cancelled while the video was being saved", bridge.check_interrupt)
        started = threading.Event()

        def encode() -> str:
            started.set()
            return mp4.save_mp4(name, frames, rate, waveform, sample_rate, tags, check=check, node=NODE)

        try:
            path = await asyncio.to_thread(encode)
        except asyncio.CancelledError:
            check.stop()  # a running encode cannot be cancelled: it stops at its next frame and removes its part
            if not started.is_set():  # still queued for a thread, where cancelling drops it: the part is ours to
                mp4.discard(name)  # remove (an encode starting meanwhile removes its own)
            raise
        preview = {"filename": name.filename, "subfolder": name.subfolder, "type": "output", "format": "video/mp4"}
        return {"ui": {"images": [preview], "animated": (True,)}, "result": (path,)}


def _frame_rate(fps: float, latent: dict | None) -> float:
    """`fps` when set (> 0), else the frame rate the latent carries."""
    if fps > 0:
        return fps
    if latent is None:
        raise LTX25Error(f"{NODE}.fps", "fps", fps, "a frame rate > 0, or 0 with `latent` connected",
                         "Connect the video latent the frames were decoded from (its frame_rate is used), or set fps.")
    return frame_rate(latent, f"{NODE}.latent")


def _run_counter(prompt: dict | None) -> int | None:
    """The counter an earlier save of this run took. ComfyUI hands every node of a run the same PROMPT dict, and
    each run a new one (the headless runner does the same), so the dict's identity names the run; the dicts are
    held while remembered, so their ids are not reused meanwhile."""
    kept = _RUN_COUNTERS.get(id(prompt)) if prompt is not None else None
    return kept[1] if kept is not None and kept[0] is prompt else None


def _remember_run_counter(prompt: dict | None, number: int) -> None:
    if prompt is None:
        return
    _RUN_COUNTERS[id(prompt)] = (prompt, number)
    _RUN_COUNTERS.move_to_end(id(prompt))
    while len(_RUN_COUNTERS) > RUNS_KEPT:
        _RUN_COUNTERS.popitem(last=False)


def _tags(metadata: str, prompt: dict | None, extra_pnginfo: dict | None) -> dict[str, str]:
    """Container tags, as ComfyUI's own savers write them: the `metadata` input (JSON stored compactly under
    "comment", anything else as typed), the run's prompt, and each extra_pnginfo entry (the canvas's workflow)."""
    tags = {}
    text = (metadata or "").strip()
    if text:
        try:
            tags["comment"] = json.dumps(json.loads(text), separators=(",", ":"))
        except json.JSONDecodeError:
            tags["comment"] = text
    if prompt is not None:
        tags["prompt"] = json.dumps(prompt)
    for key, value in (extra_pnginfo or {}).items():
        tags[key] = json.dumps(value)
    return tags


def _one_track(audio: dict | None, frames: int, fps: float) -> tuple[np.ndarray | None, int]:
    """AUDIO `[B, C, S]` → (one `[C, S']` float32 track, sample rate): batch items play one after another, as their
    frames do, each fitted to its own video's length so item b's sound starts with item b's first frame."""
    from ..media import mp4
    if audio is None:
        return None, 48000
    waveform = audio.get("waveform") if isinstance(audio, dict) else None
    if not isinstance(waveform, torch.Tensor) or waveform.ndim != 3:
        raise LTX25Error(f"{NODE}.audio", "the audio waveform", getattr(waveform, "shape", type(waveform).__name__),
                         "an AUDIO dict with waveform [B, C, S]")
    if waveform.shape[0] > 1 and frames % waveform.shape[0]:
        raise LTX25Error(f"{NODE}.audio", "the audio batch size", waveform.shape[0],
                         f"a divisor of the {frames} frames (one track per video in the batch)")
    sample_rate = int(audio.get("sample_rate", 48000))
    tracks = waveform.detach().to("cpu", torch.float32).numpy()
    if tracks.shape[0] == 1:
        return tracks[0], sample_rate
    per_item = round(frames // tracks.shape[0] / fps * sample_rate)
    return np.concatenate([mp4.fit_audio(track, per_item, sample_rate, f"{NODE}.audio") for track in tracks],
                          axis=-1), sample_rate


NODE_CLASS_MAPPINGS = {NODE: LTX25SaveVideo}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Save Video"}
