"""The transformer a text encoder's features are for, found in the graph before the encode: the Gemma version of
the two files is compared when the text encoder is about to run, not at the Connector after the 12B encode.

ComfyUI hands a node the whole prompt (hidden input PROMPT) and its own id (UNIQUE_ID). From Encode Prompt the
features go to Connector nodes; each Connector's `model` input leads back, through any node that takes and gives
the model (Load LoRA), to a Load Transformer node whose file name is a widget value, known before anything runs."""
from __future__ import annotations

from typing import Any, Mapping

from . import bridge
from ..ltx.errors import LTX25Error
from ..ltx.files.assets import AssetInfo, Kind, check_gemma_pairing, inspect_asset

CONNECTOR, TRANSFORMER_LOADER = "LTX25Connector", "LTX25TransformerLoader"


def _link_from(value: Any) -> str | None:
    """The source node id of an API-format link `[node_id, output_index]`, else None."""
    return value[0] if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) else None


def transformer_files_fed(prompt: Mapping[str, Mapping], node_id: str) -> list[str]:
    """Names of the transformer files (Load Transformer's widget) whose model meets `node_id`'s features at a
    Connector; a model that comes from anything but a chain of `model` inputs ending at a loader is left out."""
    files = []
    for node in prompt.values():
        inputs = node.get("inputs", {})
        if node.get("class_type") != CONNECTOR or _link_from(inputs.get("text_features")) != node_id:
            continue
        source, seen = _link_from(inputs.get("model")), set()
        while source in prompt and source not in seen:
            seen.add(source)
            upstream = prompt[source]
            if upstream.get("class_type") == TRANSFORMER_LOADER:
                name = upstream.get("inputs", {}).get("transformer_file")
                if isinstance(name, str):
                    files.append(name)
                break
            source = _link_from(upstream.get("inputs", {}).get("model"))
    return list(dict.fromkeys(files))


def check_pairing_before_encode(prompt: Mapping[str, Mapping] | None, node_id: str | None,
                                text_encoder: AssetInfo) -> None:
    """Refuse a text encoder whose Gemma version differs from a transformer its features will meet (an
    LTX25Error naming both files), before the encode. A transformer file that cannot be read here is left to its
    loader node, which names the problem."""
    if not prompt or node_id is None:  # called outside a graph (a script): the Connector still checks
        return
    for name in transformer_files_fed(prompt, str(node_id)):
        try:
            transformer = inspect_asset(bridge.model_file_path("diffusion_models", name))
        except LTX25Error:
            continue
        if transformer.kind is Kind.TRANSFORMER:
            check_gemma_pairing(transformer, text_encoder)
