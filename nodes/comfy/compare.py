"""The decoder A/B node: the same latents decoded by both video VAEs, side by side, with a JSON report."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch

from . import bridge
from .previews import preview_frame_indices, write_preview_frames
from ..ltx.decode.compare import check_comparable, check_labels, compare_report, report_json, side_by_side


class LTX25DecoderCompare:
    DESCRIPTION = ("Puts two decodes of the same latent side by side with labels and reports per-frame PSNR/SSIM, "
                   "seconds, peak memory and tiles of each decoder.")
    CATEGORY = "LTX-2.5/compare"
    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("side_by_side", "report_json")
    OUTPUT_TOOLTIPS = ("Both videos in one frame, labelled.", "JSON: PSNR/SSIM per frame and mean, decoder costs.")
    OUTPUT_NODE = True
    FUNCTION = "compare"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images_a": ("IMAGE", {"tooltip": "Decoder A's frames (e.g. the conv VAE)."}),
            "images_b": ("IMAGE", {"tooltip": "Decoder B's frames of the same latent (e.g. the diffusion VAE)."}),
            "label_a": ("STRING", {"default": "conv VAE", "tooltip": "Label burned into A's half."}),
            "label_b": ("STRING", {"default": "diffusion VAE", "tooltip": "Label burned into B's half."}),
            "layout": (["side_by_side", "stacked"], {"tooltip": "Halves left/right or top/bottom."}),
            "resize_b": ("BOOLEAN", {"default": False, "tooltip": "Resize B to A's size instead of refusing a mismatch."}),
        }, "optional": {
            "stats_a": ("LTX25_DECODE_STATS", {"tooltip": "Decoder A's cost figures."}),
            "stats_b": ("LTX25_DECODE_STATS", {"tooltip": "Decoder B's cost figures."}),
        }}

    async def compare(self, images_a, images_b, label_a, label_b, layout, resize_b, stats_a=None, stats_b=None):
        """A coroutine whose work runs on a worker thread: ComfyUI's executor picks ready output nodes first, and
        the saves of both decodes (output nodes too, ready as soon as their frames are) then start beside it
        rather than after it. A cancelled run stops that work at its next check."""
        check_labels(label_a, label_b)  # before the viewer's frames are started
        bridge.check_interrupt()  # nor started for a run being stopped
        check = bridge.TaskCheck("the run was cancelled while the decodes were compared", bridge.check_interrupt)
        try:
            return await asyncio.to_thread(_like_caller(self._compare), images_a, images_b, label_a, label_b, layout,
                                           resize_b, stats_a, stats_b, check)
        except asyncio.CancelledError:
            check.stop()
            raise

    def _compare(self, images_a, images_b, label_a, label_b, layout, resize_b, stats_a, stats_b, check):
        images_b = check_comparable(images_a, images_b, resize_b)
        picks = preview_frame_indices(images_a.shape[0])
        folder = bridge.temp_dir()
        frames = {side: [{"filename": name, "subfolder": "", "type": "temp"}
                         for name in write_preview_frames(images, folder, f"ltx25_ab_{side}", picks)]
                  for side, images in (("a", images_a), ("b", images_b))}
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltx25-compare") as pool:
            # the canvas is made on another thread while the metrics run on the GPU
            canvas = pool.submit(_like_caller(side_by_side), images_a, images_b, label_a, label_b, layout)
            report = compare_report(images_a, images_b, (label_a, label_b), {"a": stats_a, "b": stats_b},
                                    bridge.compute_device(), check=check)
            canvas = canvas.result()
        text = report_json(report)
        viewer = {"frames_a": frames["a"], "frames_b": frames["b"], "frame_indices": picks,
                  "label_a": label_a, "label_b": label_b}
        return {"ui": {"text": [text], "ltx25_report": [report], "ltx25_ab": [viewer]},
                "result": (canvas, text)}


def _like_caller(fn):
    """`fn` for a worker thread, under the calling thread's inference mode (it is per thread): ComfyUI runs nodes
    in inference mode and expects their output tensors to be inference tensors."""
    mode = torch.is_inference_mode_enabled()

    def run(*args):
        with torch.inference_mode(mode):
            return fn(*args)
    return run


NODE_CLASS_MAPPINGS = {"LTX25DecoderCompare": LTX25DecoderCompare}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25DecoderCompare": "LTX-2.5 Decoder Compare (A/B)"}
