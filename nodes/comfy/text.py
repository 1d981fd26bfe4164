"""Prompt encoding node: Gemma-4 on the GPU through model management only while a prompt is not cached."""
from __future__ import annotations

import re

from . import bridge
from .pairing import check_pairing_before_encode
from ..ltx.text import encoder as te
from ..ltx.text.tokenizer import check_prompt_text
from ..ltx.errors import LTX25Error

NODE = "LTX25EncodePrompt"

PROMPT_SEPARATOR = re.compile(r"^[ \t]*---[ \t]*$", re.MULTILINE)


def split_prompts(text: str) -> list[str]:
    """A line holding only `---` separates prompts; blank parts are skipped; a blank text is one empty prompt."""
    parts = [p.strip() for p in PROMPT_SEPARATOR.split(text)]
    return [p for p in parts if p] or [""]


def _placement(spec: te.TextEncoderSpec, batch: int):
    """Engine hooks: register the module with model management, load it with the activation estimate; unload."""
    def load(module, patcher):
        if spec.device == "cpu":  # stays where it was built: no device memory, no model management
            return None
        patcher = patcher or bridge.make_patcher(module, name=spec.info.name)
        try:
            bridge.load_models([patcher], te.working_memory(spec, batch))
        except BaseException:  # e.g. out of memory while loading: the engine never gets a handle to release
            bridge.discard_model(patcher)
            raise
        return patcher
    # The engine drops the module after the release: its weights are freed, not copied back to the host first.
    return load, bridge.discard_model


class LTX25EncodePrompt:
    DESCRIPTION = "Encodes prompts with the Gemma-4 text encoder into projected video and audio text features."
    CATEGORY = "LTX-2.5/text"
    RETURN_TYPES = ("LTX25_TEXT_FEATURES",)
    RETURN_NAMES = ("text_features",)
    OUTPUT_TOOLTIPS = ("Video [B,1024,4096] and audio [B,1024,2048] features with their mask (B = prompts); "
                       "feed them to LTX-2.5 Connector.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "text_encoder": ("LTX25_TEXT_ENCODER", {"tooltip": "From LTX-2.5 Load Text Encoder."}),
            "prompt": ("STRING", {"multiline": True, "default": "",
                                  "tooltip": "What to generate, image and sound. Several prompts (a batch): put a "
                                             "line holding only --- between them. At most 1023 tokens each; the "
                                             "rest is dropped with a warning. An empty prompt is encoded as BOS "
                                             "alone, like the reference."}),
            "keep_loaded": ("BOOLEAN", {"default": False,
                                        "tooltip": "Keep Gemma (24 GB) in memory for the next new prompt. Off: it is "
                                                   "freed right after encoding; repeated prompts are cached anyway."}),
        }, "hidden": {"graph": "PROMPT", "unique_id": "UNIQUE_ID"}}

    def encode(self, text_encoder, prompt: str, keep_loaded: bool = False, graph=None, unique_id=None):
        if not isinstance(text_encoder, te.TextEncoderSpec):
            raise LTX25Error("text_encoder input", "the value", type(text_encoder).__name__,
                             "an LTX25_TEXT_ENCODER", "Connect LTX-2.5 Load Text Encoder to it.")
        # the transformer these features will meet, from the graph: a Gemma mismatch is refused before the encode
        check_pairing_before_encode(graph, unique_id, text_encoder.info)
        prompts = split_prompts(check_prompt_text(prompt, f"{NODE}.prompt"))
        load_hook, release_hook = _placement(text_encoder, len(prompts))
        features = te.encode_prompts(
            text_encoder, prompts, keep_loaded=keep_loaded, load_hook=load_hook, release_hook=release_hook,
            on_step=bridge.step_callback(text_encoder.num_states, "encode prompt"),
            output_device=bridge.intermediate_device())
        return (features,)


NODE_CLASS_MAPPINGS = {"LTX25EncodePrompt": LTX25EncodePrompt}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25EncodePrompt": "LTX-2.5 Encode Prompt"}
