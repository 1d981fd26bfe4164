"""Conditioning nodes that make LTX25_GUIDES (docs/MODEL.md §16): an image at a frame (image-to-video, first–last
frame, keyframes), an audio track held fixed (audio-to-video), and the window that extends a clip with its join.

The Image Guide hands the sampler a provider, not a latent: each stage calls it with its own grid, and it encodes
the image at that stage's size, as the reference re-encodes its conditioning images for every stage (stage 1 at
half size, stage 2 at full size). The H.264 pre-compression runs once, at the image's own size, before the resize
(for one image; a batch of 8k+1 frames is a clip, encoded as it is, from the frame index on).
"""
from __future__ import annotations

import math

from . import bridge
from .sampling import MAX_FRAMES
from ..ltx import latents
from ..ltx.errors import LTX25Error
from ..ltx.geometry import AUDIO_LATENTS_PER_SECOND, TEMPORAL_COMPRESSION, audio_latent_frames

CATEGORY = "LTX-2.5/conditioning"
IMAGE_NODE, AUDIO_NODE = "LTX25ImageGuide", "LTX25AudioGuide"
EXTEND_NODE, JOIN_NODE = "LTX25ExtendClip", "LTX25JoinExtension"
GUIDES_OUT = ("LTX25_GUIDES",)
CHAIN_INPUT = ("LTX25_GUIDES", {"tooltip": "Optional: guides to add these to (chain several guide nodes)."})


def chain_guides(own, guides):
    """`own` added after the chained `guides` (None: just `own`); anything else on the chain input is refused."""
    from ..ltx.dit.guides import Guides
    if guides is None:
        return own
    if not isinstance(guides, Guides):
        raise LTX25Error("guides", "the chained value", type(guides).__name__, "LTX25_GUIDES",
                         "Connect the guides output of another LTX-2.5 guide node.")
    return guides + own


def check_strength(value: float, where: str) -> float:
    """A guide's strength as a float in [0, 1], or an error naming `where`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                             and 0.0 <= value <= 1.0):
        raise LTX25Error(where, "strength", value, "in [0, 1] (1: held exactly, 0: no conditioning)")
    return float(value)


def encode_frames(encoder, frames, where: str):
    """Fitted frames `[N, H, W, 3]` → their latent through the video encoder handle, asking model management for
    the encode's working memory and tiling only when the untiled encode would not fit (docs/MODEL.md §17.2)."""
    from ..ltx.decode.tiling import TilingRequest
    from ..ltx.encode.video_encoder import encode_video, working_memory
    pixels, request = frames.unsqueeze(0), TilingRequest("auto")  # [1, N, H, W, 3]
    module = encoder.ready(working_memory(encoder.module, tuple(pixels.shape), request))
    return encode_video(module, pixels, request, bridge.free_device_memory(), where=where,
                        check=bridge.check_interrupt)


class ImageProvider:
    """Encodes one (pre-compressed) image `[1, H, W, 3]`, or 8k+1 consecutive frames `[8k+1, H, W, 3]`, at each stage
    grid's pixel size, cached per size; checks `frame_index` (and the frames after it) against the grid first, so a
    bad index names this node rather than the sampler."""

    def __init__(self, encoder, image, frame_index: int):
        self.encoder, self.image, self.frame_index = encoder, image, frame_index
        self.cache: dict[tuple[int, int], object] = {}
        self.calls: list[tuple[int, int]] = []  # the sizes asked for, in order (what tests and notes read)

    def __call__(self, grid):
        from ..ltx.encode.image_prep import resize_crop
        first, last = grid.first_frame, grid.last_frame
        count = self.image.shape[0]
        frame = last + 1 + self.frame_index if self.frame_index < 0 else self.frame_index
        if not first <= frame <= last - (count - 1):
            what = "" if count == 1 else f" (its {count} frames must end by the clip's last frame)"
            length = last - first + 1
            expected = (f"{first} … {last - count + 1} (or −{count} … −{length} from the end) for this clip of "
                        f"{length} frames" if count <= length else
                        f"a clip of at least {count} frames (it has {length})")
            raise LTX25Error(f"{IMAGE_NODE}.frame_index", f"frame_index{what}", self.frame_index, expected,
                             "Lower it, or make the clip longer (frames on Empty Latent).")
        size = (grid.pixel_width, grid.pixel_height)
        self.calls.append(size)
        if size not in self.cache:
            self.cache[size] = encode_frames(self.encoder, resize_crop(self.image, *size, where=IMAGE_NODE),
                                             IMAGE_NODE)
        return self.cache[size]


class LTX25ImageGuide:
    DESCRIPTION = ("Conditions the clip on an image at a frame: frame 0 for image-to-video, −1 for the last frame; "
                   "chain two for first–last frame, one per keyframe. A batch of 8k+1 images is that many consecutive "
                   "frames from frame_index on.")
    CATEGORY = CATEGORY
    RETURN_TYPES = GUIDES_OUT
    RETURN_NAMES = ("guides",)
    OUTPUT_TOOLTIPS = ("The guides (with the chained ones), for both samplers: each stage encodes the image at its "
                       "own size.",)
    FUNCTION = "guide"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "image": ("IMAGE", {"tooltip": "One image, or a batch of 8k+1 consecutive frames (9, 17, …: what the "
                                "video encoder takes) placed from frame_index on; for keyframes apart, chain a node "
                                "per keyframe. Scaled to cover the clip and centre-cropped: another aspect loses its "
                                "edges, never stretches."}),
            "video_encoder": ("LTX25_VIDEO_ENCODER", {"tooltip": "From LTX-2.5 Load Video Encoder."}),
            "frame_index": ("INT", {"default": 0, "min": -8193, "max": 8192, "tooltip": (
                "The pixel frame the image (a batch's first frame) is: 0 the first (it replaces the first latent "
                "frames), −1 the last; negative counts from the end. Checked against the clip's length at "
                "sampling.")}),
            "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01,
                                   "tooltip": "1: the frame is held exactly; lower lets the model move away from it."}),
        }, "optional": {"guides": CHAIN_INPUT}}

    def guide(self, image, video_encoder, frame_index, strength, guides=None):
        import torch
        from ..ltx.dit.guides import Guides, VideoGuide
        from ..ltx.encode.image_prep import image_crf
        from ..media.crf import precompress
        from .encode import check_image
        frames = check_image(image, f"{IMAGE_NODE}.image")
        count = frames.shape[0]
        if (count - 1) % TEMPORAL_COMPRESSION:  # the causal video encoder takes 1 + 8k frames
            shorter = count - (count - 1) % TEMPORAL_COMPRESSION
            raise LTX25Error(f"{IMAGE_NODE}.image", "the number of images", count,
                             f"1, or 8k+1 consecutive frames ({shorter} or {shorter + TEMPORAL_COMPRESSION} here)",
                             "Trim the batch to 8k+1 frames, or chain one Image Guide per keyframe (its guides "
                             "input), each with its frame_index.")
        if isinstance(frame_index, bool) or not isinstance(frame_index, int):
            raise LTX25Error(f"{IMAGE_NODE}.frame_index", "frame_index", repr(frame_index), "a whole number")
        strength = check_strength(strength, f"{IMAGE_NODE}.strength")
        # an image is pre-compressed as the reference pre-compresses image conditionings; a clip's frames are not
        # (as LTX-2.5 Encode Video leaves a clip, and the reference its video conditionings)
        crf = image_crf(video_encoder.module.model_version) if count == 1 else 0
        pixels = frames.detach().float().cpu()
        if crf:
            pixels = torch.from_numpy(precompress(pixels.numpy(), crf, IMAGE_NODE))
        provider = ImageProvider(video_encoder, pixels, frame_index)
        return (chain_guides(Guides(video=(VideoGuide(provider, frame_index, strength, "auto"),)), guides),)


def audio_clip_frames(audio_latents: int, fps: float) -> int:
    """The fewest 8k+1 pixel frames whose clip at `fps` has at least `audio_latents` audio latents."""
    frames = 1
    while audio_latent_frames(frames, fps) < audio_latents:
        frames += TEMPORAL_COMPRESSION
    return frames


class LTX25AudioGuide:
    DESCRIPTION = "Holds the given audio fixed while the video is sampled (audio-to-video)."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_GUIDES", "INT")
    RETURN_NAMES = ("guides", "frames")
    OUTPUT_TOOLTIPS = ("The guides (with the chained ones), for both samplers.",
                       "The 8k+1 frame count the audio covers at fps: wire it to Empty Latent's frames.")
    FUNCTION = "guide"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "audio": ("AUDIO", {"tooltip": "Any sample rate; held from the clip's start. Longer than the clip is an "
                                "error at sampling; longer than Empty Latent's 1025 frames at fps, here."}),
            "audio_encoder": ("LTX25_AUDIO_ENCODER", {"tooltip": "From LTX-2.5 Load Audio Encoder."}),
            "fps": ("FLOAT", {"default": 24.0, "min": 1.0, "max": 120.0, "step": 1.0,
                              "tooltip": "The clip's frame rate (Empty Latent's fps): only for the frames output."}),
            "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01,
                                   "tooltip": "1: the audio is kept bit for bit."}),
        }, "optional": {"guides": CHAIN_INPUT}}

    def guide(self, audio, audio_encoder, fps, strength, guides=None):
        from ..ltx.dit.guides import AudioGuide, Guides
        from .encode import LTX25EncodeAudio
        strength = check_strength(strength, f"{AUDIO_NODE}.strength")
        latent = LTX25EncodeAudio().encode(audio_encoder, audio)[0]["samples"]
        count = latent.shape[2]

        def provider(grid):  # the length check names this node (the engine's would name the sampler)
            if count > grid.audio_frames:
                raise LTX25Error(f"{AUDIO_NODE}.audio", "the audio's length",
                                 f"{count / AUDIO_LATENTS_PER_SECOND:.2f} s ({count} latents)",
                                 f"at most {grid.audio_frames / AUDIO_LATENTS_PER_SECOND:.2f} s ({grid.audio_frames} latents, the clip's)",
                                 f"Set Empty Latent's frames to {audio_clip_frames(count, grid.fps)} (this node's "
                                 "frames output), or trim the audio.")
            return latent

        frames = audio_clip_frames(count, float(fps))
        if frames > MAX_FRAMES:  # refused here rather than by Empty Latent, which would not name the audio
            longest = audio_latent_frames(MAX_FRAMES, float(fps)) / AUDIO_LATENTS_PER_SECOND
            raise LTX25Error(f"{AUDIO_NODE}.audio", "the audio's length", f"{count / AUDIO_LATENTS_PER_SECOND:.2f} s",
                             f"at most {longest:.2f} s at {float(fps):g} fps (Empty Latent's {MAX_FRAMES} frames)",
                             "Trim the audio.")
        own = Guides(audio=(AudioGuide(provider, 0, strength),))
        return (chain_guides(own, guides), frames)


def _source(video_latent, audio_latent, where: str):
    video = latents.check_video_latent(latents.unbind_av(video_latent["samples"], latents.VIDEO_STREAM,
                                                         f"{where}.video_latent"), f"{where}.video_latent")
    audio = latents.unbind_av(audio_latent["samples"], latents.AUDIO_STREAM, f"{where}.audio_latent")
    return video, audio, latents.frame_rate(video_latent, f"{where}.video_latent", default=24.0)


class LTX25ExtendClip:
    DESCRIPTION = ("Continues a clip: empty latents for a window that starts with the clip's last latent frames "
                   "held, and the guides that hold them; sample the window, then Join Extension.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT", "LATENT", "LTX25_GUIDES")
    RETURN_NAMES = ("video_latent", "audio_latent", "guides")
    OUTPUT_TOOLTIPS = ("The window's video latent (zeros, for the sampler).", "The window's audio latent.",
                       "The overlap and the source's audio from the window's start, held, in the joined clip's "
                       "positions: connect to the window's sampler.")
    FUNCTION = "extend"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "video_latent": ("LATENT", {"tooltip": "The clip to continue (a sampler's video output, full size)."}),
            "audio_latent": ("LATENT", {"tooltip": "Its audio latent."}),
            "new_frames": ("INT", {"default": 48, "min": 8, "max": 1024, "step": 8,
                                   "tooltip": "Pixel frames to add: a multiple of 8."}),
            "overlap": ("INT", {"default": 2, "min": 1, "max": 128,
                                "tooltip": "The source's last latent frames (8 pixel frames each) the window "
                                "starts with, held: more overlap, smoother motion across the seam."}),
            "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01,
                                   "tooltip": "1: the overlap is kept bit for bit (the join is then seamless)."}),
        }}

    def extend(self, video_latent, audio_latent, new_frames, overlap, strength):
        from ..ltx.dit.extend import extension_guides, plan_extension, window_latents
        video, audio, fps = _source(video_latent, audio_latent, EXTEND_NODE)
        strength = check_strength(strength, f"{EXTEND_NODE}.strength")
        plan = plan_extension(tuple(video.shape), tuple(audio.shape), fps, new_frames, overlap, EXTEND_NODE)
        window_video, window_audio = window_latents(video, audio, plan)
        guides = extension_guides(video, audio, plan, strength)
        return ({"samples": window_video, "frame_rate": fps, latents.HALF_SIZE_KEY: False,
                 latents.EXTENSION_OVERLAP_KEY: overlap},
                {"samples": window_audio, "type": "audio", "frame_rate": fps}, guides)


class LTX25JoinExtension:
    DESCRIPTION = "Joins a clip and its sampled extension window into one longer clip's latents."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT", "LATENT")
    RETURN_NAMES = ("video_latent", "audio_latent")
    OUTPUT_TOOLTIPS = ("The joined video latent: the source's frames, then the window's new ones.",
                       "The joined audio latent.")
    FUNCTION = "join"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "video_latent": ("LATENT", {"tooltip": "The source clip's video latent (what Extend Clip got)."}),
            "audio_latent": ("LATENT", {"tooltip": "The source clip's audio latent."}),
            "window_video": ("LATENT", {"tooltip": "The sampled window's video latent."}),
            "window_audio": ("LATENT", {"tooltip": "The sampled window's audio latent."}),
            "overlap": ("INT", {"default": 2, "min": 1, "max": 128, "tooltip": "Extend Clip's overlap (a window "
                                "that carries it from Extend Clip is checked against it)."}),
        }}

    def join(self, video_latent, audio_latent, window_video, window_audio, overlap):
        from ..ltx.dit.extend import join_extension, plan_extension
        video, audio, fps = _source(video_latent, audio_latent, JOIN_NODE)
        w_video, w_audio, _ = _source(window_video, window_audio, JOIN_NODE)
        made_with = window_video.get(latents.EXTENSION_OVERLAP_KEY)
        if made_with is not None and made_with != overlap:
            raise LTX25Error(f"{JOIN_NODE}.overlap", "overlap", overlap, f"{made_with}, the overlap the window was "
                             "made with", "Set it to Extend Clip's overlap.")
        new_frames = (w_video.shape[2] - overlap) * TEMPORAL_COMPRESSION
        if new_frames <= 0:
            raise LTX25Error(f"{JOIN_NODE}.overlap", "overlap", overlap,
                             f"below the window's {w_video.shape[2]} latent frames", "Use Extend Clip's overlap.")
        plan = plan_extension(tuple(video.shape), tuple(audio.shape), fps, new_frames, overlap, JOIN_NODE)
        joined_video, joined_audio = join_extension(video, audio, w_video, w_audio, plan, JOIN_NODE)
        return ({**video_latent, "samples": joined_video, "frame_rate": fps},
                {**audio_latent, "samples": joined_audio, "type": "audio", "frame_rate": fps})


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (LTX25ImageGuide, LTX25AudioGuide, LTX25ExtendClip,
                                                LTX25JoinExtension)}
NODE_DISPLAY_NAME_MAPPINGS = {
    IMAGE_NODE: "LTX-2.5 Image Guide",
    AUDIO_NODE: "LTX-2.5 Audio Guide",
    EXTEND_NODE: "LTX-2.5 Extend Clip",
    JOIN_NODE: "LTX-2.5 Join Extension",
}
