"""Guidance nodes for the full (dev) transformer: the multimodal guider (prompts and per-modality scales, as the
reference's video and audio guiders) and the guided sampler (dev schedule; Euler, Euler-ancestral or res_2s)."""
from __future__ import annotations

from . import bridge
from .sampling import (DEFAULT_FRAME_RATE, GUIDES_INPUT, LATENT_PAIR_TOOLTIPS, NOISE_LAYOUT_TOOLTIP, SEED_INPUT,
                       STAGE_LATENTS, check_working_memory, per_token, stage_latents, stage_noise, stage_outputs)
from ..ltx.dit import dev_sampling, guidance as ltx_guidance, sampling
from ..ltx.errors import LTX25Error

CATEGORY = "LTX-2.5/sampling"
SHIFTS = ("4096 tokens", "latent tokens")


def _scale(default: float, tooltip: str, high: float = 100.0) -> tuple:
    return ("FLOAT", {"default": default, "min": 0.0, "max": high, "step": 0.05, "tooltip": tooltip})


class LTX25MultimodalGuider:
    DESCRIPTION = ("Prompts and guidance scales for the full (dev) LTX-2.5 transformer, per modality (the "
                   "reference's defaults). Neutral scales (cfg 1, stg 0, a2v/v2a 1) run one forward per step.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_GUIDER",)
    RETURN_NAMES = ("guider",)
    OUTPUT_TOOLTIPS = ("Prompts and scales for LTX-2.5 Guided Sampler.",)
    FUNCTION = "guide"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "positive": ("LTX25_CONDITIONING", {"tooltip": "The prompt, from LTX-2.5 Connector."}),
            "video_cfg": _scale(3.0, "Video classifier-free guidance (1 = off): pulls toward the prompt, away from "
                                     "the negative."),
            "audio_cfg": _scale(7.0, "Audio classifier-free guidance (1 = off)."),
            "video_stg": _scale(1.0, "Video spatio-temporal guidance (0 = off): away from a pass whose video "
                                     "self-attention in the STG blocks passes its values through."),
            "audio_stg": _scale(1.0, "Audio spatio-temporal guidance (0 = off), same for the audio "
                                     "self-attention."),
            "video_stg_blocks": ("STRING", {"default": "28", "tooltip": "Blocks (0-47) whose video self-attention "
                                            "the STG pass skips, e.g. '28' or '27, 28'; 'all' for every block."}),
            "audio_stg_blocks": ("STRING", {"default": "28", "tooltip": "Blocks whose audio self-attention the STG "
                                            "pass skips."}),
            "a2v_scale": _scale(3.0, "Modality guidance for video (1 = off): away from a pass without audio↔video "
                                     "cross-attention; helps lip sync."),
            "v2a_scale": _scale(3.0, "Modality guidance for audio (1 = off)."),
            "video_rescale": _scale(0.7, "Rescales the guided video toward the prompt pass's spread (0 = off, 1 = "
                                         "full); less over-saturation.", 1.0),
            "audio_rescale": _scale(0.7, "The same for audio.", 1.0),
        }, "optional": {
            "negative": ("LTX25_CONDITIONING", {"tooltip": "The negative prompt (Encode Prompt → Connector; it may be "
                                                           "empty). Needed when a cfg is not 1."}),
        }}

    def guide(self, positive, video_cfg, audio_cfg, video_stg, audio_stg, video_stg_blocks, audio_stg_blocks,
              a2v_scale, v2a_scale, video_rescale, audio_rescale, negative=None):
        where = "LTX25MultimodalGuider"
        video = ltx_guidance.ModalityGuidance(video_cfg, video_stg, ltx_guidance.parse_blocks(
            video_stg_blocks, f"{where}.video_stg_blocks"), video_rescale, a2v_scale)
        audio = ltx_guidance.ModalityGuidance(audio_cfg, audio_stg, ltx_guidance.parse_blocks(
            audio_stg_blocks, f"{where}.audio_stg_blocks"), audio_rescale, v2a_scale)
        for name, params in (("video", video), ("audio", audio)):
            if params.uses_perturbed() and params.stg_blocks == ():
                raise LTX25Error(f"{where}.{name}_stg_blocks", "the block list", "empty", "at least one block",
                                 f"With no block the STG pass equals the prompt pass; set {name}_stg to 0 instead.")
        guidance = ltx_guidance.Guidance(positive, negative, video, audio)
        guidance.check(where=where)  # the blocks against the model: in the sampler
        return (guidance,)


class LTX25GuidedSampler:
    DESCRIPTION = ("Samples audio+video latents with the full (dev) LTX-2.5 transformer and a multimodal guider: the "
                   "reference's dev schedule, Euler (its two-stage pipeline), Euler-ancestral or res_2s (its HQ one).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT", "LATENT")
    RETURN_NAMES = ("video_latent", "audio_latent")
    OUTPUT_TOOLTIPS = LATENT_PAIR_TOOLTIPS
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            **STAGE_LATENTS,
            "model": ("LTX25_MODEL", {"tooltip": "The LTX-2.5 transformer: the dev checkpoint, maybe with LoRAs."}),
            "guider": ("LTX25_GUIDER", {"tooltip": "From LTX-2.5 Multimodal Guider."}),
            **SEED_INPUT,
            "steps": ("INT", {"default": dev_sampling.DEV_STEPS, "min": 1, "max": 1000,
                              "tooltip": "Steps of the dev schedule (stage 1; the reference: 30, its HQ variant 15)."}),
            "sampler": (list(dev_sampling.SAMPLERS), {"default": "euler", "tooltip": "euler: the reference's dev "
                        "two-stage pipeline. res_2s: its HQ pipeline (two forwards per step, fewer steps). "
                        "euler_ancestral: the distilled stage 1's stepper."}),
            "schedule_shift": (list(SHIFTS), {"default": SHIFTS[0], "tooltip": "How the dev schedule is shifted: as "
                               "for 4096 tokens (the two-stage pipeline) or for this latent's size (the HQ one)."}),
            "stage": (["1", "2"], {"default": "1", "tooltip": "1: from noise with the dev schedule. 2: re-noise an "
                                   "upsampled latent, distilled stage-2 sigmas (0.909375 → 0)."}),
            "pass_batching": (list(ltx_guidance.PASS_BATCHING), {"default": "sequential", "tooltip": "sequential: one "
                              "forward per guidance pass (least memory; the reference's default). batched: all passes "
                              "in one forward (more memory, fewer launches)."}),
            "acceleration": (list(ltx_guidance.ACCELERATIONS), {"default": "auto", "tooltip": "auto: CUDA graphs on "
                             "a CUDA GPU (one per pass shape, captured on first use), eager elsewhere."}),
        }, "optional": {
            "sigmas": ("STRING", {"default": "", "tooltip": "Custom schedule, e.g. '1.0, 0.9, 0.5, 0.0' (decreasing, "
                                  "≤ 1, ending at 0); replaces steps and schedule_shift."}),
            "frame_rate": ("FLOAT", {"default": DEFAULT_FRAME_RATE, "min": 1.0, "max": 120.0, "step": 0.01,
                                     "tooltip": "Only for latents that carry no frame rate: the fps of the clip."}),
            "guides": GUIDES_INPUT,
            "noise_layout": (list(sampling.NOISE_LAYOUTS), {"default": "comfy", "tooltip": NOISE_LAYOUT_TOOLTIP}),
        }}

    def sample(self, model, guider, video_latent, audio_latent, seed, steps, sampler, schedule_shift, stage,
               pass_batching, acceleration, sigmas="", frame_rate=DEFAULT_FRAME_RATE, guides=None,
               noise_layout="comfy"):
        where = "LTX25GuidedSampler"
        sampling.check_noise_layout(noise_layout, f"{where}.noise_layout")
        ltx_guidance.check_acceleration(acceleration, bridge.compute_device(), f"{where}.acceleration")
        fps, video, audio, held, dit_shape = stage_latents(video_latent, audio_latent, frame_rate, guides, where,
                                                           int(stage))
        _check_prompts(guider, video.shape[0], f"{where}.guider")
        guider.check(len(model.module.dit.transformer_blocks), "LTX25MultimodalGuider")
        tokens = dev_sampling.latent_tokens(video.shape) if schedule_shift == SHIFTS[1] else dev_sampling.MAX_TOKENS
        schedule = sampling.parse_sigmas(sigmas or "", f"{where}.sigmas") or (
            dev_sampling.dev_sigmas(steps, tokens) if stage == "1" else sampling.STAGE2_SIGMAS)
        rows = len(guider.passes()) if pass_batching == "batched" else 1
        memory = sampling.working_memory(model.module, (rows * video.shape[0], *dit_shape[1:]), audio.shape,
                                         **per_token(held))
        check_working_memory(where, memory)
        skip, drawn = stage_noise(video_latent, int(stage), video, audio, held)
        module = model.ready(memory)
        try:
            video, audio = dev_sampling.sample_guided(
                module, guider, video, audio, fps=fps, seed=seed, sigmas=schedule, sampler=sampler, stage=int(stage),
                on_x0=bridge.step_callback(dev_sampling.progress_total(schedule, sampler), f"LTX-2.5 {sampler}",
                                           preview_latent=True),
                output_device=bridge.intermediate_device(), acceleration=acceleration, batching=pass_batching,
                guides=held, noise_layout=noise_layout, noise_skip=skip, check=bridge.check_interrupt)
        finally:
            bridge.empty_cache()
        return stage_outputs(video_latent, audio_latent, video, audio, fps, drawn)


def _check_prompts(guider, batch: int, where: str) -> None:
    """Each prompt (positive, negative) holds one prompt for the whole batch or one per clip."""
    if not isinstance(guider, ltx_guidance.Guidance):
        raise LTX25Error(where, "the value", type(guider).__name__, "an LTX25_GUIDER",
                         "Connect LTX-2.5 Multimodal Guider to it.")
    for name, cond in (("positive", guider.positive), ("negative", guider.negative)):
        count = None if cond is None else cond.video.shape[0]
        if count not in (None, 1, batch):
            raise LTX25Error(f"{where}.{name}", "the number of prompts", count, f"1 or {batch} (the latent batch)",
                             "Separate prompts with --- lines in Encode Prompt, one per clip.")


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (LTX25MultimodalGuider, LTX25GuidedSampler)}
NODE_DISPLAY_NAME_MAPPINGS = {
    "LTX25MultimodalGuider": "LTX-2.5 Multimodal Guider",
    "LTX25GuidedSampler": "LTX-2.5 Guided Sampler",
}
