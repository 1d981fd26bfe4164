"""The IC-LoRA reference-video node (docs/MODEL.md §16.7): a control video (depth, pose, edges, …) appended to stage 1's
tokens at the size and frame spacing the model's IC-LoRA was trained with, as Lightricks' IC-LoRA pipeline does.

Like the Image Guide it hands the sampler a provider: the stage calls it with its grid, and it fits the frames to
1/s of that stage's size (cover and centre-crop) and encodes them. The reference pipeline uses the reference video in
stage 1 only, where the IC-LoRA is applied; its stage 2 runs the plain model with neither. An attention strength
below 1 or a mask weighs how much the clip and the reference attend to each other (a mask provider resizes the mask
to the reference's latent grid at the stage's size).
"""
from __future__ import annotations

from .guides import CATEGORY, CHAIN_INPUT, chain_guides, check_strength, encode_frames
from ..ltx.errors import LTX25Error

NODE = "LTX25ReferenceVideoGuide"
# The most of the reference's width or height the centre crop may cut: a control video is followed cell by cell,
# so a reference of another aspect than the clip's would silently move or lose what it controls. Frame sizes rounded
# to the 32/64-px grid differ by a few percent (1280×720 into 1280×704: 2 %); 16:9 into 3:2 would cut 16 %.
MAX_CROP = 0.05


class ReferenceProvider:
    """Fits and encodes the reference frames `[N, H, W, 3]` for a stage grid (cached per size and clip length),
    after checking the frame count and aspect against that grid, so the errors name this node."""

    def __init__(self, encoder, frames, spatial: int, temporal: int):
        self.encoder, self.frames, self.spatial, self.temporal = encoder, frames, spatial, temporal
        self.cache: dict[tuple[int, int, int], object] = {}

    def __call__(self, grid):
        from ..ltx.encode.image_prep import (crop_fraction, reference_clip_frames, reference_frame_indices,
                                             resize_crop)
        from ..ltx.geometry import TEMPORAL_COMPRESSION, pixel_frames
        count, clip = self.frames.shape[0], pixel_frames(grid.frames)
        picked = reference_frame_indices(count, clip, self.temporal)
        if (len(picked) - 1) % TEMPORAL_COMPRESSION:
            thinned = f", {len(picked)} after keeping every {self.temporal}th" if self.temporal > 1 else ""
            raise LTX25Error(f"{NODE}.images", "the reference frames used", f"{min(count, clip)} of {count}{thinned}",
                             "8k + 1 frames for the video encoder (the reference video's first frames, up to the "
                             "clip's length" + (f", every {self.temporal}th kept" if self.temporal > 1 else "") + ")",
                             f"Set Empty Latent's frames to {reference_clip_frames(count, self.temporal)} (this "
                             "node's frames output), or trim the video to fit the clip.")
        height, width = grid.pixel_height // self.spatial, grid.pixel_width // self.spatial
        cut = crop_fraction(tuple(self.frames.shape[1:3]), (grid.pixel_height, grid.pixel_width))
        if cut > MAX_CROP:
            raise LTX25Error(f"{NODE}.images", "the reference video's aspect",
                             f"{self.frames.shape[2]}×{self.frames.shape[1]} px (fitting it to the clip's "
                             f"{grid.pixel_width}×{grid.pixel_height} would cut {cut:.0%} of it)",
                             f"the clip's aspect within {MAX_CROP:.0%}", "The IC-LoRA follows the control video "
                             "cell by cell: give the clip the video's aspect (Empty Latent's width and height), or "
                             "crop the video first.")
        key = (width, height, len(picked))
        if key not in self.cache:
            self.cache[key] = encode_frames(self.encoder, resize_crop(self.frames[picked], width, height,
                                                                      where=NODE), NODE)
        return self.cache[key]


class MaskProvider:
    """The attention mask `[F, H, W]` as one weight per reference token for a stage grid and the reference latent's
    (f, h, w) there (`reference_attention.mask_video_tokens`), after checking its aspect like the frames'."""

    def __init__(self, mask):
        self.mask = mask

    def __call__(self, grid, latent_fhw):
        from ..ltx.dit.reference_attention import mask_video_tokens
        from ..ltx.encode.image_prep import crop_fraction
        from ..ltx.geometry import pixel_frames
        stage_hw = (grid.pixel_height, grid.pixel_width)
        cut = crop_fraction(tuple(self.mask.shape[1:3]), stage_hw)
        if cut > MAX_CROP:
            raise LTX25Error(f"{NODE}.attention_mask", "the mask's aspect",
                             f"{self.mask.shape[2]}×{self.mask.shape[1]} px (fitting it to the clip's "
                             f"{grid.pixel_width}×{grid.pixel_height} would cut {cut:.0%} of it)",
                             f"the clip's aspect within {MAX_CROP:.0%}", "Give the mask the reference video's size.")
        return mask_video_tokens(self.mask, stage_hw, latent_fhw, pixel_frames(grid.frames), f"{NODE}.attention_mask")


def check_mask(mask, where: str):
    """A ComfyUI MASK `[F, H, W]` (or one `[H, W]` frame) of finite values in [0, 1], float32 on the CPU."""
    import torch
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3) or 0 in mask.shape \
            or not mask.is_floating_point():
        found = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise LTX25Error(where, "the mask", found, "a MASK: float frames [F, H, W] (or one [H, W])",
                         "Connect a mask video, e.g. a video's frames through Convert Image to Mask.")
    mask = mask.detach().float().cpu()
    if not torch.isfinite(mask).all() or mask.min() < 0 or mask.max() > 1:
        raise LTX25Error(where, "the mask's values", f"in [{mask.min():.3g}, {mask.max():.3g}]",
                         "finite values in [0, 1] (0: no attention, 1: full)")
    return mask[None] if mask.ndim == 2 else mask


class LTX25ReferenceVideoGuide:
    DESCRIPTION = ("Conditions stage 1 on an IC-LoRA's reference video (a depth, pose or edge video, …): appended to "
                   "the clip's tokens at the size and frame spacing the IC-LoRA was trained with.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_GUIDES", "INT")
    RETURN_NAMES = ("guides", "frames")
    OUTPUT_TOOLTIPS = ("The guides (with the chained ones) for the stage-1 sampler, whose model carries the IC-LoRA; "
                       "stage 2 runs without the IC-LoRA and without this guide, as the reference does.",
                       "The longest 8k+1 clip the video covers at the IC-LoRA's frame spacing: wire it to Empty "
                       "Latent's frames.")
    FUNCTION = "guide"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("LTX25_MODEL", {"tooltip": "The transformer with the IC-LoRA (LTX-2.5 Load LoRA's output): its "
                                      "reference scale factors set the size and frame spacing of the encode."}),
            "images": ("IMAGE", {"tooltip": "The reference video's frames (e.g. Get Video Components' images), at the "
                                 "clip's frame rate and aspect; frames past the clip's length are not used."}),
            "video_encoder": ("LTX25_VIDEO_ENCODER", {"tooltip": "From LTX-2.5 Load Video Encoder."}),
            "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01, "tooltip": (
                "1: the reference tokens stay clean, as the IC-LoRA was trained; lower lets the sampler denoise "
                "them too.")}),
        }, "optional": {
            "guides": CHAIN_INPUT,
            "attention_strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01, "tooltip": (
                "How much the clip and the reference attend to each other in the video self-attention (times the "
                "mask): 1 as trained (no attention mask is made); 0 the clip ignores the reference there.")}),
            "attention_mask": ("MASK", {"tooltip": (
                "Optional mask video [frames, H, W], values 0…1, of the reference video's size: per region and "
                "frame, how much the clip attends to the reference (times attention_strength). One frame holds "
                "for all; otherwise the clip's frame count (the frames output).")}),
        }}

    def guide(self, model, images, video_encoder, strength, guides=None, attention_strength=1.0,
              attention_mask=None):
        from ..ltx.dit.guides import Guides, ReferenceGuide
        from ..ltx.dit.reference_attention import check_attention_strength
        from ..ltx.encode.image_prep import reference_clip_frames
        from .encode import check_image
        frames = check_image(images, f"{NODE}.images")
        strength = check_strength(strength, f"{NODE}.strength")
        attention = check_attention_strength(attention_strength, f"{NODE}.attention_strength")
        mask = None if attention_mask is None else MaskProvider(check_mask(attention_mask, f"{NODE}.attention_mask"))
        if not getattr(model, "loras", ()):
            # A plain LoRA cannot be told from an IC-LoRA trained at scale 1 (neither carries metadata), so any
            # LoRA passes; with none, the base model would only see extra clean tokens it was never trained on.
            raise LTX25Error(f"{NODE}.model", "the model", "without a LoRA", "the transformer with an IC-LoRA",
                             "Connect the model output of LTX-2.5 Load LoRA with the IC-LoRA file, at a strength "
                             "other than 0 (0 returns the model without the LoRA): the base model was not trained "
                             "to follow a reference video.")
        scales = model.reference
        provider = ReferenceProvider(video_encoder, frames.detach().float().cpu(), scales.spatial, scales.temporal)
        own = Guides(reference=(ReferenceGuide(provider, strength, scales.spatial, scales.temporal, attention, mask),))
        return (chain_guides(own, guides), reference_clip_frames(frames.shape[0], scales.temporal))


NODE_CLASS_MAPPINGS = {NODE: LTX25ReferenceVideoGuide}
NODE_DISPLAY_NAME_MAPPINGS = {NODE: "LTX-2.5 Reference Video Guide (IC-LoRA)"}
