"""What a conditioning template's finished run must show, read from its nodes' outputs: every sampler holds what its
guides give (an Image Guide at frame 0: the first latent frame is the image encoded at that stage's size; an Audio
Guide: the audio latents are the given audio's bit for bit; an extension window: its overlap is the source clip's
last latent frames bit for bit, and the join is the source followed by the window's new frames; an IC-LoRA's
Reference Video Guide: the stage-1 reference it encoded is the encode of the frames it must keep — the first, then
every `temporal`-th — fitted to 1/`spatial` of stage 1's size).

Shared by tests/test_guide_workflows.py (the pack's headless runner) and tests/comfyui_inprocess_driver.py (ComfyUI's
own executor, which imports the pack under a package name made from its folder): so this module imports no pack module
itself; the callers hand it `pack`, a function from a module's name inside the pack (`"ltx.encode.image_prep"`) to
the module, and `output`, a function from a node id to that node's outputs (a sequence, one value per output).
Measures only: the callers assert (the headless test with its own tolerances, the ComfyUI tier on the driver's report).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

import torch

PackModules = Callable[[str], ModuleType]
Outputs = Callable[[str], Sequence[Any]]
SAMPLERS = ("LTX25DistilledSampler", "LTX25GuidedSampler")
# The CRF the reference pre-compresses an LTX-2.5 conditioning image at (docs/MODEL.md §16).
IMAGE_CRF = 18


def image_latent(pack: PackModules, encoder: Any, image: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """The latent an Image Guide must hold for `image` `[1, H, W, 3]` at a stage of width×height pixels: the image
    H.264-compressed at CRF 18 at its own size, scaled to cover the stage and centre-cropped, then the video encoder
    (`encoder`: the video encoder loader's handle)."""
    frames = pack("ltx.encode.image_prep").resize_crop(
        torch.from_numpy(pack("media.crf").precompress(image.float().cpu().numpy(), IMAGE_CRF)), width, height)
    tiling = pack("ltx.decode.tiling").TilingRequest("off")
    return pack("ltx.encode.video_encoder").encode_video(encoder.module, frames[None], tiling)


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def _linked(prompt: dict, output: Outputs, link: list) -> Any:
    return output(link[0])[link[1]]


def guide_chain(prompt: dict, link: Any) -> Iterator[str]:
    """The ids of the guide nodes a `guides` link reaches: the node it comes from, then the ones chained into it."""
    while _is_link(link):
        yield link[0]
        link = prompt[link[0]]["inputs"].get("guides")


def measure(prompt: dict, output: Outputs, pack: PackModules) -> dict[str, list[dict]]:
    """Per kind ("image", "audio", "extend", "reference"), one entry per (sampler, guide) pair the graph conditions:
    which nodes, and how far the sampler's output (or the reference the guide encoded) is from what the guide holds
    (`max_abs` and the held values' `scale`), or whether it is that bit for bit (`equal`)."""
    found: dict[str, list[dict]] = {"image": [], "audio": [], "extend": [], "reference": []}
    for sampler_id, sampler in sorted(prompt.items()):
        if sampler["class_type"] not in SAMPLERS:
            continue
        for guide_id in guide_chain(prompt, sampler["inputs"].get("guides")):
            guide = prompt[guide_id]
            inputs = guide["inputs"]
            entry: dict[str, Any] = {"sampler": sampler_id, "guide": guide_id}
            if guide["class_type"] == "LTX25ImageGuide" and inputs["frame_index"] == 0:
                video = output(sampler_id)[0]["samples"]
                want = image_latent(pack, _linked(prompt, output, inputs["video_encoder"]),
                                    _linked(prompt, output, inputs["image"]), video.shape[4] * 32, video.shape[3] * 32)
                entry.update(shape=list(video.shape), max_abs=float((video[:, :, :1] - want).abs().max()),
                             scale=float(want.abs().max()))
                found["image"].append(entry)
            elif guide["class_type"] == "LTX25AudioGuide":
                audio = output(sampler_id)[1]["samples"]
                latent = pack("comfy.encode").LTX25EncodeAudio().encode(
                    _linked(prompt, output, inputs["audio_encoder"]),
                    _linked(prompt, output, inputs["audio"]))[0]["samples"]
                entry.update(latents=int(latent.shape[2]), frames=int(output(guide_id)[1]),
                             equal=bool(torch.equal(audio[:, :, :latent.shape[2]], latent)))
                found["audio"].append(entry)
            elif guide["class_type"] == "LTX25ExtendClip":
                overlap = inputs["overlap"]
                source = _linked(prompt, output, inputs["video_latent"])["samples"]
                window = output(sampler_id)[0]["samples"]
                entry.update(overlap=overlap, source_frames=int(source.shape[2]), window_frames=int(window.shape[2]),
                             overlap_equal=bool(torch.equal(window[:, :, :overlap], source[:, :, -overlap:])))
                for join_id, join in sorted(prompt.items()):
                    if join["class_type"] == "LTX25JoinExtension" and join["inputs"]["window_video"][0] == sampler_id:
                        joined = output(join_id)[0]["samples"]
                        entry.update(join=join_id, joined_frames=int(joined.shape[2]),
                                     source_kept=bool(torch.equal(joined[:, :, :source.shape[2]], source)),
                                     window_joined=bool(torch.equal(joined[:, :, source.shape[2]:],
                                                                    window[:, :, overlap:])))
                found["extend"].append(entry)
            elif guide["class_type"] == "LTX25ReferenceVideoGuide":
                provider = output(guide_id)[0].reference[0].latent
                video = output(sampler_id)[0]["samples"]
                prep, tiling = pack("ltx.encode.image_prep"), pack("ltx.decode.tiling")
                frames = _linked(prompt, output, inputs["images"])
                picked = prep.reference_frame_indices(frames.shape[0], pack("ltx.geometry").pixel_frames(
                    video.shape[2]), provider.temporal)
                width, height = video.shape[4] * 32 // provider.spatial, video.shape[3] * 32 // provider.spatial
                want = pack("ltx.encode.video_encoder").encode_video(
                    _linked(prompt, output, inputs["video_encoder"]).module,
                    prep.resize_crop(frames[picked].float(), width, height)[None], tiling.TilingRequest("off"))
                held = provider.cache.get((width, height, len(picked)))
                entry.update(encoded=[list(k) for k in provider.cache], picked=len(picked),
                             max_abs=float("inf") if held is None else float((held - want).abs().max()),
                             scale=float(want.abs().max()))
                found["reference"].append(entry)
    return found
