"""The encoders' nodes: load the video encoder (bundled in either video-VAE file) and the audio encoder (in the audio
VAE file), and encode IMAGE frames / AUDIO into LTX-2.5 latents."""
from __future__ import annotations

from . import bridge
from .decode_tiling import tiling_inputs
from .loaders import CATEGORY as LOADERS, dtype_input, file_input, load_registered
from ..ltx.decode.tiling import TilingRequest
from ..ltx.device_memory import weight_bytes
from ..ltx.errors import LTX25Error
from ..ltx.files.assets import Kind

ENCODE = "LTX-2.5/encode"
VIDEO_NODE, AUDIO_NODE = "LTX25EncodeVideo", "LTX25EncodeAudio"
AUTO_CRF = -1
# the reference's tiled encode: 768 px tiles with 64 px overlap, 80-frame tiles with 24 frames overlap
TILING_INPUTS = tiling_inputs(80, 768, 24, 64, "At least 16 frames / 64 px when tiling (the reference's floor): "
                              "each tile's padded border must fade out.", work="encode", model="encoder")


class LTX25VideoEncoderLoader:
    DESCRIPTION = "Loads the LTX-2.5 video encoder that both video VAE files bundle (conv or diffusion file)."
    CATEGORY = LOADERS
    RETURN_TYPES = ("LTX25_VIDEO_ENCODER",)
    OUTPUT_TOOLTIPS = ("The conv video encoder, its latent statistics and the file's model_version.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "vae_file": file_input("vae", "ltx-2.5-video-vae-conv-bf16 or ltx-2.5-video-vae-bf16: both carry the "
                                    "same encoder", Kind.CONV_VAE, Kind.DIFFUSION_VAE),
            "weight_dtype": dtype_input()}}

    def load(self, vae_file: str, weight_dtype: str):
        from ..ltx.encode.video_encoder import load_video_encoder
        kinds = (Kind.CONV_VAE, Kind.DIFFUSION_VAE)
        return (load_registered("vae", vae_file, kinds, load_video_encoder, weight_dtype),)


class LTX25AudioEncoderLoader:
    DESCRIPTION = "Loads the LTX-2.5 audio encoder from the audio VAE file."
    CATEGORY = LOADERS
    RETURN_TYPES = ("LTX25_AUDIO_ENCODER",)
    OUTPUT_TOOLTIPS = ("The audio encoder (log-mel in, 25 latent frames per second out) and its statistics.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"audio_vae_file": file_input("vae", "ltx-2.5-audio-vae-bf16.safetensors", Kind.AUDIO_VAE),
                             "weight_dtype": dtype_input()}}

    def load(self, audio_vae_file: str, weight_dtype: str):
        from ..ltx.encode.audio_encoder import load_audio_encoder
        return (load_registered("vae", audio_vae_file, Kind.AUDIO_VAE, load_audio_encoder, weight_dtype),)


def check_image(images: object, where: str):
    """A ComfyUI IMAGE `[F, H, W, 3]` (float, frames on the first axis), or an error naming `where`."""
    import torch
    if isinstance(images, dict) and "samples" in images:
        raise LTX25Error(where, "the input", "a LATENT", "an IMAGE [F, H, W, 3]", "It is encoded already.")
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[-1] != 3 \
            or not images.is_floating_point():
        found = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise LTX25Error(where, "the input", found, "an IMAGE: float frames [F, H, W, 3]",
                         "An RGBA image needs its alpha removed; connect a Load Image or a video's frames.")
    if images.shape[0] < 1 or images.shape[1] < 1 or images.shape[2] < 1:
        raise LTX25Error(where, "the input", f"an IMAGE of shape {list(images.shape)}", "at least one frame of "
                         "at least 1×1 pixels", "The batch is empty: check what feeds it (e.g. a video loader "
                         "that read no frames).")
    return images


def prepare_frames(images: object, model_version: str | None, width: int, height: int, crf: int, where: str):
    """IMAGE `[F, H, W, 3]` → (frames `[1, F, H', W', 3]` for `encode_video`, the CRF used): pre-compressed at
    `crf` (AUTO_CRF: the model's CRF for a single image, as the reference does for image conditionings, none for a
    clip; 0: off), then fitted to width × height by the reference's cover-and-centre-crop (both 0: as they are)."""
    import torch
    from ..ltx.encode.image_prep import image_crf, resize_crop
    from ..media.crf import precompress
    frames = check_image(images, f"{where}.images")
    if crf == AUTO_CRF:
        crf = image_crf(model_version) if frames.shape[0] == 1 else 0
    if crf:
        frames = torch.from_numpy(precompress(frames.detach().float().cpu().numpy(), crf, where))
    if width or height:
        frames = resize_crop(frames, width, height, where)
    return frames.unsqueeze(0), crf


class LTX25EncodeVideo:
    DESCRIPTION = "Encodes IMAGE frames (one image or an 8k+1-frame clip) into an LTX-2.5 video latent."
    CATEGORY = ENCODE
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("Normalized video latent [1, 128, (F−1)/8+1, H/32, W/32] with its frame_rate.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 0, "min": 0, "max": 8192, "step": 32}
        return {"required": {
            "video_encoder": ("LTX25_VIDEO_ENCODER", {"tooltip": "From LTX-2.5 Load Video Encoder."}),
            "images": ("IMAGE", {"tooltip": "One image, or a clip of 8k+1 frames (1, 9, 17, …, 121)."}),
            "frame_rate": ("FLOAT", {"default": 24.0, "min": 1.0, "max": 120.0, "step": 0.01,
                                     "tooltip": "The clip's frame rate, carried on the latent for the sampler."}),
            "width": ("INT", {**size, "tooltip": "Scale to cover width × height, then crop the centre (a multiple of "
                              "32). 0 with height 0: keep the size, which must be a multiple of 32."}),
            "height": ("INT", {**size, "tooltip": "See width."}),
            "crf": ("INT", {"default": AUTO_CRF, "min": AUTO_CRF, "max": 51, "tooltip": (
                "H.264 pre-compression before encoding, as the model was trained. −1: the model's CRF (18 for "
                "LTX-2.5, from the file's model_version) for a single image, none for a clip — the reference's "
                "rule; 0: off; 1–51: that CRF for every frame.")}),
            **TILING_INPUTS}}

    def encode(self, video_encoder, images, frame_rate, width, height, crf, tiling, tile_frames, tile_pixels,
               overlap_frames, overlap_pixels, memory_budget_gb):
        from ..ltx.encode.video_encoder import encode_video, working_memory
        pixels, used = prepare_frames(images, video_encoder.module.model_version, width, height, crf, VIDEO_NODE)
        request = TilingRequest(tiling, tile_frames, tile_pixels, overlap_frames, overlap_pixels, memory_budget_gb)
        request.check(VIDEO_NODE, weight_bytes(video_encoder.module))
        encoder = video_encoder.ready(working_memory(video_encoder.module, tuple(pixels.shape), request))
        latent = encode_video(encoder, pixels, request, bridge.free_device_memory(),
                              bridge.step_callback(1, "video encode"), where=VIDEO_NODE, check=bridge.check_interrupt,
                              on_plan=bridge.show_on_node)
        if used:
            bridge.show_on_node(f"{VIDEO_NODE}: frames pre-compressed with H.264 at CRF {used}")
        return ({"samples": latent.to(bridge.intermediate_device()), "frame_rate": float(frame_rate)},)


class LTX25EncodeAudio:
    DESCRIPTION = "Encodes an AUDIO waveform into an LTX-2.5 audio latent (25 latent frames per second)."
    CATEGORY = ENCODE
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("Normalized audio latent [B, 8, T, 16].",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "audio_encoder": ("LTX25_AUDIO_ENCODER", {"tooltip": "From LTX-2.5 Load Audio Encoder."}),
            "audio": ("AUDIO", {"tooltip": "Any sample rate (resampled to 16 kHz); mono or stereo."})}}

    def encode(self, audio_encoder, audio):
        from ..ltx.encode.audio_encoder import check_waveform, encode_audio, working_memory
        if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
            raise LTX25Error(f"{AUDIO_NODE}.audio", "the input", type(audio).__name__,
                             "an AUDIO {'waveform': [B, C, N], 'sample_rate': Hz}",
                             "The source may have no audio track; connect a Load Audio or a video's audio.")
        waveform = check_waveform(audio["waveform"], audio["sample_rate"], audio_encoder.module, f"{AUDIO_NODE}.audio")
        encoder = audio_encoder.ready(working_memory(audio_encoder.module, tuple(waveform.shape), audio["sample_rate"]))
        latent = encode_audio(encoder, audio["waveform"], audio["sample_rate"], where=AUDIO_NODE,
                              check=bridge.check_interrupt)
        return ({"samples": latent.to(bridge.intermediate_device()), "type": "audio"},)


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (LTX25VideoEncoderLoader, LTX25AudioEncoderLoader, LTX25EncodeVideo,
                                                LTX25EncodeAudio)}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LTX25VideoEncoderLoader": "LTX-2.5 Load Video Encoder",
    "LTX25AudioEncoderLoader": "LTX-2.5 Load Audio Encoder",
    VIDEO_NODE: "LTX-2.5 Encode Video",
    AUDIO_NODE: "LTX-2.5 Encode Audio",
}
