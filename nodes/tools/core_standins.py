"""Headless stand-ins for the core ComfyUI nodes the conditioning templates start from, `LoadImage`, `LoadAudio`,
`LoadVideo` and `GetVideoComponents`: the same class names, input names and outputs, reading a file from an input
folder with PyAV. Inside
ComfyUI the real core nodes run (these are never registered as pack nodes); the headless runner and the tests use
these so the templates run without ComfyUI. Only what the templates use is here: no masks from alpha, no upload."""
from __future__ import annotations

import os

import av
import numpy as np
import torch

from ..ltx.errors import LTX25Error

_input_dir = os.path.join(os.getcwd(), "input")


def set_input_dir(path: str) -> None:
    """The folder LoadImage / LoadAudio list and read (ComfyUI's input folder; the runner's --input)."""
    global _input_dir
    _input_dir = path


def _files() -> list[str]:
    return sorted(f for f in os.listdir(_input_dir) if os.path.isfile(os.path.join(_input_dir, f))) \
        if os.path.isdir(_input_dir) else []


def _path(name: str, where: str) -> str:
    path = os.path.join(_input_dir, name)
    if not os.path.isfile(path):
        raise LTX25Error(where, "the file", name, f"a file in the input folder {_input_dir}")
    return path


class LoadImage:
    CATEGORY = "image"
    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load_image"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": (_files(), {"image_upload": True})}}

    def load_image(self, image: str):
        with av.open(_path(image, "LoadImage.image")) as container:
            rgb = next(container.decode(video=0)).to_ndarray(format="rgb24")
        pixels = torch.from_numpy(rgb.astype(np.float32) / 255.0)[None]
        return pixels, torch.zeros(pixels.shape[:3])


class LoadAudio:
    CATEGORY = "audio"
    RETURN_TYPES = ("AUDIO",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"audio": (_files(), {"audio_upload": True})}}

    def load(self, audio: str):
        with av.open(_path(audio, "LoadAudio.audio")) as container:
            stream = container.streams.audio[0]
            rate = stream.rate
            planar = av.AudioResampler(format="fltp", layout=stream.layout, rate=rate)
            chunks = [out.to_ndarray() for frame in container.decode(audio=0) for out in planar.resample(frame)]
        waveform = torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32))
        return ({"waveform": waveform[None], "sample_rate": rate},)


class VideoFile:
    """What the stand-in LoadVideo hands on (core's VIDEO): the file, decoded when its components are asked for."""

    def __init__(self, path: str):
        self.path = path


class LoadVideo:
    CATEGORY = "video"
    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"file": (_files(), {"video_upload": True})}}

    def load(self, file: str):
        return (VideoFile(_path(file, "LoadVideo.file")),)


class GetVideoComponents:
    """Core's outputs in its order (images, audio, fps, bit depth, colour space); only the frames and the frame rate
    are read here (the audio output is None)."""
    CATEGORY = "video"
    RETURN_TYPES = ("IMAGE", "AUDIO", "FLOAT", "INT", "COMBO")
    RETURN_NAMES = ("images", "audio", "fps", "bit_depth", "color_space")
    FUNCTION = "get"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO", {})}}

    def get(self, video: VideoFile):
        with av.open(video.path) as container:
            stream = container.streams.video[0]
            rgb = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
            fps = float(stream.average_rate or 0)
        return torch.from_numpy(np.stack(rgb).astype(np.float32) / 255.0), None, fps, 8, ""


CLASSES = {"LoadImage": LoadImage, "LoadAudio": LoadAudio, "LoadVideo": LoadVideo,
           "GetVideoComponents": GetVideoComponents}
