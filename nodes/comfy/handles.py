"""What flows between nodes for the pack's custom types: an engine module, its model-management patcher and
the inspected file it came from."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import torch

from . import bridge
from ..ltx.files.assets import AssetInfo, Kind
from ..ltx.files.lora import LoraFactors, LoraFile, ReferenceScales
from ..ltx.errors import LTX25Error
from ..ltx.memory_fit import frames_bytes


PATCHABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# How a LoRA's factors reach the weights. on_the_fly: two small GEMMs per patched layer and forward, the weights
# untouched (the only way onto quantized weights). merged: W + strength·delta written into the weights when the
# view is loaded, the originals kept on the host to undo it. auto: on the fly (docs/MODEL.md §15.5 gives the rule).
LORA_APPLY = ("auto", "on_the_fly", "merged")


@dataclass(frozen=True)
class Loaded:
    """LTX25_MODEL, LTX25_VIDEO_VAE, LTX25_AUDIO_VAE, LTX25_UPSAMPLER: weights stay offloaded until `ready`.

    A handle is a view of one engine module: `clone()` gives another view with its own weight patches (ComfyUI's
    `ModelPatcher.clone()` in ComfyUI, the standalone patcher's twin elsewhere), so two branches of a graph can use
    differently patched versions of one loaded model; the weights are patched in place when a view is made ready,
    never copied whole."""
    module: torch.nn.Module
    patcher: object
    info: AssetInfo
    reference: ReferenceScales = ReferenceScales()  # the IC-LoRAs' reference-video scaling (1, 1 without one)
    loras: tuple[str, ...] = ()  # the names of the LoRA files applied to this view, in order

    @classmethod
    def register(cls, module: torch.nn.Module, info: AssetInfo,
                 on_unload: Callable[[torch.nn.Module], None] | None = None) -> "Loaded":
        return cls(module, bridge.make_patcher(module, on_unload, name=info.name), info)

    def clone(self) -> "Loaded":
        return replace(self, patcher=bridge.clone_patcher(self.patcher))

    def with_weight_deltas(self, deltas: Mapping[str, torch.Tensor | LoraFactors], strength: float = 1.0,
                           apply: str = "auto") -> "Loaded":
        """A clone whose weights act as `weight + strength·delta` for each module state-dict key in `deltas`: a
        dense delta (a fine-tune's difference, merged into a float weight) or a LoRA's `LoraFactors`, applied as
        `apply` says (`LORA_APPLY`; on a weight stored quantized always on the fly). Unknown keys, wrong shapes,
        dense deltas on quantized weights and merges into them are refused by name."""
        if apply not in LORA_APPLY:
            raise LTX25Error(self.info.name, "the LoRA application", repr(apply), " / ".join(LORA_APPLY))
        prefix = bridge.patch_key_prefix(self.patcher)
        known = self.module.state_dict(keep_vars=True)
        unknown = [key for key in deltas if key not in known]
        if unknown:
            raise LTX25Error(self.info.name, "weight patch keys", ", ".join(unknown[:3]),
                             f"keys of the model's state dict (e.g. {next(iter(known))})")
        merged, on_the_fly = {}, {}
        for key, delta in deltas.items():
            quantized = known[key].dtype not in PATCHABLE_DTYPES
            if isinstance(delta, LoraFactors):
                self._check_factors(key, delta, quantized, apply)
                (merged if apply == "merged" else on_the_fly)[key] = delta
                continue
            if quantized:
                # A quantized weight plus a delta, cast back to its storage, would be silently wrong.
                raise LTX25Error(self.info.name, f"the weight {key}", f"stored quantized ({known[key].dtype})",
                                 "a bf16, fp16 or fp32 weight for a dense delta", "Dense deltas need a float model: "
                                 "load the transformer with weight_dtype bf16 (not 'as stored' or FP8 compute); LoRA "
                                 "pairs work on either.")
            if tuple(delta.shape) != tuple(known[key].shape):
                raise LTX25Error(self.info.name, f"the patch for {key}", tuple(delta.shape), tuple(known[key].shape))
            merged[key] = delta
        twin = self.clone()
        if merged:
            twin.patcher.add_patches({prefix + key: bridge.weight_patch(delta) for key, delta in merged.items()},
                                     strength)
        if on_the_fly:
            bridge.add_low_rank(twin.patcher, on_the_fly, strength)
        return twin

    def _check_factors(self, key: str, factors: LoraFactors, quantized: bool, apply: str) -> None:
        layer = self.module.get_submodule(key.rpartition(".")[0]) if key.endswith(".weight") else None
        shape = (layer.out_features, layer.in_features) if hasattr(layer, "in_features") else None
        if shape is None:
            raise LTX25Error(self.info.name, f"the LoRA target {key}", "not a Linear layer's weight",
                             "the weight of a Linear layer")
        if tuple(factors.shape) != shape:
            raise LTX25Error(self.info.name, f"the LoRA for {key} (out, in)", tuple(factors.shape), shape)
        if quantized and apply == "merged":
            raise LTX25Error(self.info.name, f"apply 'merged' for {key}", "a weight stored quantized",
                             "a float weight to merge into", "Merging would round the sum back into the quantized "
                             "format; use 'auto' or 'on_the_fly', or load the transformer with weight_dtype bf16.")

    def with_lora(self, lora: LoraFile, strength: float, apply: str = "auto", name: str = "LoRA") -> "Loaded":
        """A clone with a read LoRA file applied (`with_weight_deltas`) carrying its IC-LoRA reference scaling. As
        in the reference's IC-LoRA pipeline, two LoRAs that ask for different non-1 scalings are refused."""
        mine, theirs = self.reference, lora.reference
        for what in ("spatial", "temporal"):
            if getattr(mine, what) != 1 and getattr(theirs, what) not in (1, getattr(mine, what)):
                raise LTX25Error(name, f"the IC-LoRA's reference {what} scale", getattr(theirs, what),
                                 f"{getattr(mine, what)} (the scale of an IC-LoRA already on this model) or 1",
                                 "IC-LoRAs trained on differently scaled reference videos cannot be combined.")
        reference = ReferenceScales(*(getattr(theirs, w) if getattr(theirs, w) != 1 else getattr(mine, w)
                                      for w in ("spatial", "temporal")))
        return replace(self.with_weight_deltas(lora.patches, strength, apply), reference=reference,
                       loras=(*self.loras, name))

    def spare_memory(self) -> int:
        """Working memory `ready` can be given without evicting another model."""
        return bridge.spare_device_memory(self.patcher)

    def ready(self, memory_required: int = 0) -> torch.nn.Module:
        """Load onto the compute device through model management (evicting others if needed, streaming what does
        not fit, applying this view's patches); the module."""
        bridge.load_models([self.patcher], memory_required)
        return self.module


def latent_for_decoder(node: str, video_vae: Loaded, latent, kind: str, file: str, other_node: str) -> torch.Tensor:
    """The `[B, 128, F', H', W']` samples of a decode node's `latent` input, after checking that `video_vae` is the
    `kind` decoder (from `file`); the other kind is pointed to `other_node`, which decodes it. Core ComfyUI's joint
    audio+video latent gives its video stream, as core's own VAE Decode takes it."""
    from ..ltx.latents import VIDEO_STREAM, check_video_latent, unbind_av
    found = getattr(video_vae.module, "kind", None)
    if found != kind:
        if found is not None:  # the other video decoder
            what, hint = f"the {found} VAE", f"Decode with the {other_node} node, or load the {kind} VAE here."
        else:
            file_kind = getattr(getattr(video_vae, "info", None), "kind", None)
            what = file_kind.with_article if file_kind is not None else "not an LTX-2.5 video VAE"
            hint = f"Load the {kind} VAE here with LTX-2.5 Load Video VAE" + (
                "; the audio VAE decodes the audio latent in LTX-2.5 Audio Decode." if file_kind is Kind.AUDIO_VAE
                else ".")
        raise LTX25Error(f"{node}.video_vae", "the connected VAE", f"{what} ({video_vae.info.name})",
                         f"the {kind} VAE ({file})", hint)
    samples = unbind_av(latent.get("samples") if isinstance(latent, dict) else latent, VIDEO_STREAM, f"{node}.latent")
    samples = check_video_latent(samples, f"{node}.latent")
    bridge.check_fits(node, "the memory of the decoded frames", frames_bytes(samples.shape),
                      bridge.intermediate_device(), "Decoded frames are float32 [F, H, W, 3]: lower width, height "
                      "or frames in LTX-2.5 Empty Latent (tiling bounds only the decoder's own working memory).")
    return samples
