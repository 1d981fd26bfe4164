"""The output node: frames + optional audio → an H.264/AAC mp4 in the output folder, never overwriting."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os

import torch

from . import bridge
from ..media import background
from ..ltx.errors import LTX25Error

NODE = "LTX25SaveVideo"


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
            "fps": ("FLOAT", {"default": 24.0, "min": 1.0, "max": 240.0, "step": 0.001,
                              "tooltip": "Frame rate; use the one the latents were made for."}),
            "filename_prefix": ("STRING", {"default": "LTX25", "tooltip": (
                "File name start (may include subfolders); a counter follows: LTX25_00001_.mp4.")})},
            "optional": {
                "audio": ("AUDIO", {"tooltip": "Waveform to mux as AAC; fitted to the video's length."}),
                "metadata": ("STRING", {"default": "", "multiline": True, "tooltip": (
                    "Run info stored in the file (JSON: prompt, seed, decoder, timings), e.g. a compare report.")})},
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    async def save(self, images, fps, filename_prefix, audio=None, metadata="", prompt=None, extra_pnginfo=None):
        """A coroutine, so ComfyUI's executor runs the CPU-bound encode on a worker thread while the next nodes (the
        other decoder, the compare) use the GPU. The file name is reserved first; a failed encode removes it. If the
        run is stopped meanwhile (a later node fails, or the user cancels), the thread still finishes its file:
        asyncio waits for it, and a complete video is kept rather than cut off or deleted."""
        from ..media.video_io import output_path, run_metadata
        tags = run_metadata(metadata)
        if prompt is not None:       # like ComfyUI's own savers: the graph travels with the file
            tags["prompt"] = json.dumps(prompt)
        if isinstance(extra_pnginfo, dict) and "workflow" in extra_pnginfo:
            tags["workflow"] = json.dumps(extra_pnginfo["workflow"])
        rate = int(audio["sample_rate"]) if isinstance(audio, dict) and "sample_rate" in audio else 48000
        waveform = _one_track(audio, images.shape[0], fps, rate)
        path, subfolder, filename = output_path(bridge.output_dir(), filename_prefix)
        # this thread only feeds the encode's helper process (which runs below the graph's priority): at the
        # graph's priority, so the encoders are never short of frames
        encode = asyncio.get_running_loop().run_in_executor(background.pool("save", nice=0), _encode, path, images,
                                                            fps, waveform, rate, tags)
        cancelled = False
        while True:  # the thread cannot be stopped: its file is finished (or removed) before the run ends
            try:
                await asyncio.shield(encode)
                break
            except asyncio.CancelledError:
                if encode.cancelled():
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        preview = {"filename": filename, "subfolder": subfolder, "type": "output", "format": "video/mp4"}
        return {"ui": {"images": [preview], "animated": (True,)}, "result": (path,)}


def _encode(path: str, images: torch.Tensor, fps: float, waveform: torch.Tensor | None, rate: int,
            tags: dict[str, str]) -> None:
    from ..media.encoder_process import write_mp4
    try:  # on a worker thread, outside the executor's (thread-local) inference mode: write_mp4 only reads
        write_mp4(path, images, fps, waveform, rate, tags)  # its inputs, converting them in their own mode
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        raise


def _one_track(audio: dict | None, frames: int, fps: float, sample_rate: int) -> torch.Tensor | None:
    """AUDIO `[B, C, S]` → one `[C, S']` track: batch items play one after another, as their frames do, each
    fitted to its own video's length so item b's sound starts with item b's first frame."""
    from ..media.video_io import fit_audio
    if audio is None:
        return None
    waveform = audio.get("waveform") if isinstance(audio, dict) else None
    if not isinstance(waveform, torch.Tensor) or waveform.ndim != 3:
        raise LTX25Error(f"{NODE}.audio", "the audio waveform", getattr(waveform, "shape", type(waveform).__name__),
                         "an AUDIO dict with waveform [B, C, S]")
    if waveform.shape[0] > 1 and frames % waveform.shape[0]:
        raise LTX25Error(f"{NODE}.audio", "the audio batch size", waveform.shape[0],
                         f"a divisor of the {frames} frames (one track per video in the batch)")
    if waveform.shape[0] == 1:
        return waveform[0]
    per_item = round(frames // waveform.shape[0] / fps * sample_rate)
    return torch.cat([fit_audio(track, per_item) for track in waveform], dim=-1)


NODE_CLASS_MAPPINGS = {NODE: LTX25SaveVideo}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Save Video"}
