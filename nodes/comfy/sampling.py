"""Sampling-stage nodes: empty audio+video latents, the distilled sampler (stage 1 / stage 2) and the x2 latent
upsampler between the stages."""
from __future__ import annotations

from . import bridge
from ..ltx import latents
from ..ltx.dit import guides as ltx_guides, sampling
from ..ltx import upsampler as ltx_upsampler
from ..ltx.dit import accelerated_denoise
from ..ltx.dit.accelerated_denoise import ACCELERATIONS
from ..ltx.errors import LTX25Error
from ..ltx.memory_fit import tensor_bytes

CATEGORY = "LTX-2.5/sampling"
MAX_SEED = 0xFFFFFFFFFFFFFFFF
DEFAULT_FRAME_RATE = 24.0  # LTX-2.5 Empty Latent's default fps
LATENT_PAIR_TOOLTIPS = ("Video latent [B,128,F',H/32,W/32] (normalized), with its frame_rate.",
                        "Audio latent [B,8,T,16], with its frame_rate.")
ACCELERATION_TOOLTIP = (
    "How each step's transformer forward runs. auto: cuda_graph on a CUDA GPU, eager elsewhere. eager: kernel by "
    "kernel. cuda_graph: the forward replayed from one CUDA graph per latent shape (captured on first use); it "
    "equals eager up to bf16 rounding. compile_cuda_graph: the repeated blocks compiled with torch.compile, cuDNN attention, "
    "then graphed; the fastest, but its first use in a process compiles (the compiled code is kept on disk for "
    "later starts; a new shape then only captures its graph) and it differs from eager by bf16 rounding. Graph modes "
    "need CUDA. Speeds: docs/PERFORMANCE.md.")
NOISE_LAYOUT_TOOLTIP = (
    "How the seed's random numbers are laid out on the latents. comfy: in the latent's own shape, as ComfyUI core's "
    "samplers do (the same seed gives core's noise). reference: on the transformer's tokens, as Lightricks' "
    "ltx-pipelines does (the same seed gives the reference's noise, up to the GPU-vs-CPU generator).")


def check_working_memory(where: str, needed: int) -> None:
    """Refuse a latent whose transformer working memory (`sampling.working_memory`) exceeds what the compute device
    can ever hold, before the model loads: otherwise it fails in the allocator or grinds for minutes first."""
    bridge.check_fits(where, "the transformer's working memory for this latent", needed, bridge.compute_device(),
                      "It grows with width × height × frames × batch: lower them in LTX-2.5 Empty Latent, or run on "
                      "a device with more memory.")


def _check_prompt_count(conditioning, batch: int) -> None:
    """One prompt serves the whole batch; otherwise one prompt per latent (checked before the model loads)."""
    prompts = getattr(conditioning, "video", None)
    if prompts is not None and prompts.shape[0] not in (1, batch):
        raise LTX25Error("LTX25DistilledSampler.conditioning", "the number of prompts", prompts.shape[0],
                         f"1 or {batch} (the latent batch)", "Separate prompts with --- lines in Encode Prompt, one "
                         "per clip, or set the batch on Empty Latent to the number of prompts.")


GUIDES_INPUT = ("LTX25_GUIDES", {"tooltip": "Optional: images, keyframes, audio or the end of a clip to condition on "
                                 "(from an LTX-2.5 conditioning node), made at this stage's size. Conditioned frames "
                                 "and audio are held as the reference holds them; appended guide frames are cropped "
                                 "from the output."})


def stage_latents(video_latent, audio_latent, frame_rate: float, guides, where: str, stage: int):
    """A sampler's latent inputs for `stage`, read and checked against each other and against `guides`
    (LTX25_GUIDES or None) before the model loads → (fps: the latent's, else `frame_rate`; the video and audio
    latents; the resolved guides or None; the video shape the DiT sees: with the appended guide frames)."""
    if stage == 2:
        latents.check_stage2_wanted(video_latent, f"{where}.video_latent")
    fps = latents.frame_rate(video_latent, f"{where}.video_latent", default=frame_rate)
    video = latents.unbind_av(video_latent["samples"], latents.VIDEO_STREAM, f"{where}.video_latent")
    audio = latents.unbind_av(audio_latent["samples"], latents.AUDIO_STREAM, f"{where}.audio_latent")
    offsets = (guides.video_offset, guides.audio_offset) if isinstance(guides, ltx_guides.Guides) else (0, 0)
    latents.check_latent_pair(video, audio, fps, where, offsets)
    held = ltx_guides.resolve(guides, video, audio, fps, f"{where}.guides")
    return fps, video, audio, held, (video.shape if held is None else held.video_clean.shape)


def stage_outputs(video_latent: dict, audio_latent: dict, video, audio, fps: float,
                  drawn: tuple[int, int] | None = None) -> tuple[dict, dict]:
    """A sampler's two LATENT outputs: the inputs' other keys kept, the frame rate used carried on both; a stage 1's
    video also carries what it drew of the seed's noise (`drawn`, `latents.NOISE_DRAWN_KEY`), for stage 2."""
    kept = {k: v for k, v in video_latent.items() if k != latents.NOISE_DRAWN_KEY}
    noise = {} if drawn is None else {latents.NOISE_DRAWN_KEY: drawn}
    return ({**kept, "samples": video, "frame_rate": fps, **noise},
            {**audio_latent, "samples": audio, "type": "audio", "frame_rate": fps})


def stage_noise(video_latent: dict, stage: int, video, audio, held) -> tuple[tuple[int, int] | None, ...]:
    """(`noise_skip` for this stage: what the stage 1 before it drew, when its latent says; what this stage draws,
    handed on when it is a stage 1)."""
    skip = video_latent.get(latents.NOISE_DRAWN_KEY) if stage == 2 else None
    return skip, (sampling.noise_drawn(video, audio, held) if stage == 1 else None)


def per_token(held) -> dict:
    """`sampling.working_memory`'s extra arguments for a guided stage (none without guides)."""
    if held is None:
        return {}
    return {"per_token": True, "attention_tokens": 0 if held.attention is None else held.attention.tokens}


# The latents and seed both samplers (distilled and guided) take. The latents are a sampler's first inputs, in the
# order of its outputs: bypassed (Ctrl+B, as the templates' two_stage note says for stage 2) it then passes each
# latent through. ComfyUI's frontend feeds a bypassed node's output i from its input i when the types match, else
# from its first input of that type: after `model` and `conditioning`, both outputs came from `video_latent`, and
# Audio Decode got the video latent.
STAGE_LATENTS = {
    "video_latent": ("LATENT", {"tooltip": "Stage 1: from Empty Latent. Stage 2: from Latent Upsample."}),
    "audio_latent": ("LATENT", {"tooltip": "Stage 1: from Empty Latent. Stage 2: stage 1's audio output."}),
}
SEED_INPUT = {"seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True,
                               "tooltip": "Noise seed (CPU generator: the same result on every device)."})}


# Empty Latent's ranges. ComfyUI checks a widget's own value against them, not a linked one (Audio Guide's frames):
# `make` checks both.
MAX_FRAMES = 1025
FPS_RANGE = (1.0, 120.0)


class LTX25EmptyLatent:
    DESCRIPTION = ("Zero video and audio latents for a clip; with two_stage on, width/height are the final size and "
                   "the video latent is the half-size stage-1 latent.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT", "LATENT")
    RETURN_NAMES = ("video_latent", "audio_latent")
    OUTPUT_TOOLTIPS = LATENT_PAIR_TOOLTIPS
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "width": ("INT", {"default": 768, "min": 32, "max": 8192, "step": 32,
                              "tooltip": "Final video width in pixels: a multiple of 64 with two_stage, else of 32."}),
            "height": ("INT", {"default": 512, "min": 32, "max": 8192, "step": 32,
                               "tooltip": "Final video height in pixels: a multiple of 64 with two_stage, else of 32."}),
            "frames": ("INT", {"default": 121, "min": 1, "max": MAX_FRAMES, "step": 8,
                               "tooltip": "Number of video frames: 8k+1 (9, 17, …, 121)."}),
            "fps": ("FLOAT", {"default": 24.0, "min": FPS_RANGE[0], "max": FPS_RANGE[1], "step": 1.0,
                              "tooltip": "Frame rate; sets the audio length and the model's time positions."}),
            "batch": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Clips per batch."}),
            "two_stage": ("BOOLEAN", {"default": True, "tooltip": "On: stage 1 at half size, then Latent Upsample "
                                      "and stage 2 at width×height. Off: one stage at width×height; bypass Latent "
                                      "Upsample and stage 2, which refuses a full-size latent."}),
        }}

    def make(self, width: int, height: int, frames: int, fps: float, batch: int, two_stage: bool):
        import torch
        if not 1 <= frames <= MAX_FRAMES:
            raise LTX25Error("LTX25EmptyLatent.frames", "frames", frames, f"1 to {MAX_FRAMES}",
                             "A linked count (LTX-2.5 Audio Guide's frames) is the audio's length: trim the audio.")
        if not FPS_RANGE[0] <= fps <= FPS_RANGE[1]:
            raise LTX25Error("LTX25EmptyLatent.fps", "fps", fps, f"{FPS_RANGE[0]:g} to {FPS_RANGE[1]:g}")
        video_shape, audio_shape = latents.empty_latent_shapes(width, height, frames, fps, batch, two_stage)
        device = bridge.intermediate_device()
        bridge.check_fits("LTX25EmptyLatent", "the memory of its video and audio latents",
                          tensor_bytes(video_shape, audio_shape), device, "Lower width, height, frames or batch; "
                          "sampling and decoding such a clip needs many times more.")
        return ({"samples": torch.zeros(video_shape, device=device), "frame_rate": fps,
                 latents.HALF_SIZE_KEY: bool(two_stage)},
                {"samples": torch.zeros(audio_shape, device=device), "type": "audio", "frame_rate": fps})


class LTX25DistilledSampler:
    DESCRIPTION = "Samples audio+video latents with the distilled LTX-2.5 schedule (stage 1, or stage 2 after upsampling)."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT", "LATENT")
    RETURN_NAMES = ("video_latent", "audio_latent")
    OUTPUT_TOOLTIPS = LATENT_PAIR_TOOLTIPS
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            **STAGE_LATENTS,
            "model": ("LTX25_MODEL", {"tooltip": "The LTX-2.5 transformer (distilled checkpoint)."}),
            "conditioning": ("LTX25_CONDITIONING", {"tooltip": "Prompt conditioning from LTX-2.5 Connector."}),
            **SEED_INPUT,
            "stage": (["1", "2"], {"default": "1", "tooltip": "1: 8 steps from noise. 2: re-noise to 0.909375, "
                                   "3 Euler steps (after Latent Upsample)."}),
            "sampler": (list(sampling.SAMPLERS), {"default": "auto", "tooltip": "auto: Euler-ancestral for stage 1 "
                        "of LTX-2.5, Euler otherwise."}),
            "acceleration": (list(ACCELERATIONS), {"default": "auto", "tooltip": ACCELERATION_TOOLTIP}),
        }, "optional": {
            "sigmas": ("STRING", {"default": "", "tooltip": "Custom schedule, e.g. '1.0, 0.9, 0.5, 0.0' (decreasing, "
                                  "≤ 1, ending at 0). Blank: the distilled schedule of the stage."}),
            "frame_rate": ("FLOAT", {"default": DEFAULT_FRAME_RATE, "min": 1.0, "max": 120.0, "step": 0.01,
                                     "tooltip": "Only for latents that carry no frame rate (core ComfyUI's Empty LTXV "
                                     "latents): the fps of the clip. LTX-2.5 Empty Latent's fps always wins."}),
            "noise_layout": (list(sampling.NOISE_LAYOUTS), {"default": "comfy", "tooltip": NOISE_LAYOUT_TOOLTIP}),
            "guides": GUIDES_INPUT,
        }}

    # cfg is no widget (distilled models take no guidance); a script or an older API prompt may still pass 1.0.
    def sample(self, model, conditioning, video_latent, audio_latent, seed, stage, sampler, cfg=1.0, sigmas="",
               acceleration="auto", frame_rate=DEFAULT_FRAME_RATE, noise_layout="comfy", guides=None):
        sampling.check_cfg(cfg, model.info.name, "LTX25DistilledSampler.cfg")
        sampling.check_noise_layout(noise_layout, "LTX25DistilledSampler.noise_layout")
        accelerated_denoise.resolve_mode(acceleration, bridge.compute_device(), "LTX25DistilledSampler.acceleration")
        fps, video, audio, held, dit_shape = stage_latents(video_latent, audio_latent, frame_rate, guides,
                                                           "LTX25DistilledSampler", int(stage))
        _check_prompt_count(conditioning, video.shape[0])
        schedule = sampling.parse_sigmas(sigmas or "", "LTX25DistilledSampler.sigmas") or \
            sampling.default_sigmas(int(stage))
        memory = sampling.working_memory(model.module, dit_shape, audio.shape, **per_token(held))
        check_working_memory("LTX25DistilledSampler", memory)
        skip, drawn = stage_noise(video_latent, int(stage), video, audio, held)
        module = model.ready(memory)
        try:
            video, audio = sampling.sample_distilled(
                module, conditioning, video, audio, fps=fps, seed=seed, stage=int(stage), sampler=sampler,
                sigmas=schedule,
                on_x0=bridge.step_callback(len(schedule) - 1, f"LTX-2.5 stage {stage}", preview_latent=True),
                output_device=bridge.intermediate_device(), acceleration=acceleration, noise_layout=noise_layout,
                guides=held, notify=bridge.show_on_node, noise_skip=skip)
        finally:
            bridge.empty_cache()  # the step activations; also on interrupt, so nothing is left half-used
        return stage_outputs(video_latent, audio_latent, video, audio, fps, drawn)


class LTX25LatentUpsample:
    DESCRIPTION = "Doubles the video latent's width and height with the LTX-2.5 latent upsampler, between the stages."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("video_latent",)
    OUTPUT_TOOLTIPS = ("Video latent [B,128,F',2H',2W'] (normalized), frame_rate kept.",)
    FUNCTION = "upsample"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "upsampler": ("LTX25_UPSAMPLER", {"tooltip": "The x2 spatial latent upscaler."}),
            "video_vae": ("LTX25_VIDEO_VAE", {"tooltip": "Either video VAE: only its per-channel latent statistics "
                                              "are used (the upsampler works on un-normalized latents)."}),
            "video_latent": ("LATENT", {"tooltip": "The stage-1 video latent."}),
        }}

    def upsample(self, upsampler, video_vae, video_latent):
        latents.check_upsample_wanted(video_latent, "LTX25LatentUpsample.video_latent")
        latent = latents.unbind_av(video_latent["samples"], latents.VIDEO_STREAM, "LTX25LatentUpsample.video_latent")
        latent = latents.check_video_latent(latent, "LTX25LatentUpsample.video_latent")  # e.g. the audio latent
        mean, std = ltx_upsampler.latent_statistics(video_vae.module, "LTX25LatentUpsample.video_vae")
        memory = ltx_upsampler.working_memory(upsampler.module, latent.shape)
        bridge.check_fits("LTX25LatentUpsample", "the upsampler's working memory for this latent", memory,
                          bridge.compute_device(), "Lower width, height or frames in LTX-2.5 Empty Latent.")
        module = upsampler.ready(memory)
        try:
            out = ltx_upsampler.upsample_latent(module, latent, mean, std, output_device=bridge.intermediate_device(),
                                                check=bridge.check_interrupt)
        finally:
            bridge.empty_cache()
        return ({**video_latent, "samples": out, latents.HALF_SIZE_KEY: False},)


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (LTX25EmptyLatent, LTX25DistilledSampler, LTX25LatentUpsample)}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LTX25EmptyLatent": "LTX-2.5 Empty Latent",
    "LTX25DistilledSampler": "LTX-2.5 Distilled Sampler",
    "LTX25LatentUpsample": "LTX-2.5 Latent Upsample",
}
