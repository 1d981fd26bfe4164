"""Conditioning-stage node: the transformer file's embeddings connectors turn projected prompt features into the
text context the DiT cross-attends to."""
from __future__ import annotations

from ..ltx.files.assets import check_gemma_pairing

CATEGORY = "LTX-2.5/conditioning"


class LTX25Connector:
    DESCRIPTION = "Runs the LTX-2.5 embeddings connectors (inside the transformer file) on encoded prompt features."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LTX25_CONDITIONING",)
    RETURN_NAMES = ("conditioning",)
    OUTPUT_TOOLTIPS = ("Video [B,1024,4096] and audio [B,1024,2048] text context for the sampler.",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("LTX25_MODEL", {"tooltip": "The LTX-2.5 transformer; its connectors run here."}),
            "text_features": ("LTX25_TEXT_FEATURES", {
                "tooltip": "Projected prompt features from LTX-2.5 Encode Prompt (the text encoder paired with this "
                           "transformer)."}),
        }}

    def connect(self, model, text_features):
        from ..ltx.dit.connector import run_connectors, working_memory
        check_gemma_pairing(model.info, text_features.source)
        module = model.ready(working_memory(model.module, text_features))
        return (run_connectors(module, text_features),)


NODE_CLASS_MAPPINGS = {"LTX25Connector": LTX25Connector}
NODE_DISPLAY_NAME_MAPPINGS = {"LTX25Connector": "LTX-2.5 Connector"}
