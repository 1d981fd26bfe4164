"""What flows between nodes for the pack's custom types: an engine module, its model-management patcher and
the inspected file it came from."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import torch

from . import bridge
from ..ltx.files.assets import AssetInfo, Kind
from ..ltx.files.lora import LoraFactors
from ..ltx.errors import LTX25Error
from ..ltx.memory_fit import frames_bytes


PATCHABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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

    @classmethod
    def register(cls, module: torch.nn.Module, info: AssetInfo,
                 on_unload: Callable[[torch.nn.Module], None] | None = None) -> "Loaded":
        return cls(module, bridge.make_patcher(module, on_unload, name=info.name), info)

    def clone(self) -> "Loaded":
        return replace(self, patcher=bridge.clone_patcher(self.patcher))

    def with_weight_deltas(self, deltas: Mapping[str, torch.Tensor | LoraFactors], strength: float = 1.0) -> "Loaded":
        """A clone whose weights are `weight + strength·delta` for each module state-dict key in `deltas`: a dense
        delta (a fine-tune's difference) or a LoRA's `LoraFactors`, whose delta is formed only when the weight is
        patched; unknown keys are refused by name."""
        prefix = bridge.patch_key_prefix(self.patcher)
        known = self.module.state_dict(keep_vars=True)
        unknown = [key for key in deltas if key not in known]
        if unknown:
            raise LTX25Error(self.info.name, "weight patch keys", ", ".join(unknown[:3]),
                             f"keys of the model's state dict (e.g. {next(iter(known))})")
        for key, delta in deltas.items():
            if known[key].dtype not in PATCHABLE_DTYPES:
                # A quantized weight plus a delta, cast back to its storage, would be silently wrong.
                raise LTX25Error(self.info.name, f"the weight {key}", f"stored quantized ({known[key].dtype})",
                                 "a bf16, fp16 or fp32 weight", "LoRAs and weight patches need a float model: load "
                                 "the transformer with weight_dtype bf16 (not 'as stored' or FP8 compute) to apply "
                                 "them.")
            if tuple(delta.shape) != tuple(known[key].shape):
                raise LTX25Error(self.info.name, f"the patch for {key}", tuple(delta.shape), tuple(known[key].shape))
        twin = self.clone()
        twin.patcher.add_patches({prefix + key: bridge.weight_patch(delta) for key, delta in deltas.items()},
                                 strength)
        return twin

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
