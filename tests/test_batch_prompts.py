"""One prompt covers a whole batch, as in ComfyUI; a conditioning of another batch size is refused by the sampler
node's name before any model is loaded."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nodes.ltx.conditioning import Conditioning
from nodes.ltx.dit import transformer as T
from nodes.ltx.errors import LTX25Error
from nodes.tools.tiny.common import TINY_DIMS


def _cond(batch: int, seed: int = 0) -> Conditioning:
    g = torch.Generator().manual_seed(seed)
    return Conditioning(torch.randn(batch, 1024, TINY_DIMS["video_inner"], generator=g),
                        torch.randn(batch, 1024, TINY_DIMS["audio_inner"], generator=g))


def test_one_prompt_conditions_every_latent_of_a_batch(transformer):
    """Batch 2 with one prompt: each sample's x0 equals that sample run alone with the same prompt (to float
    rounding of batched kernels), where the check used to refuse the batch."""
    g = torch.Generator().manual_seed(1)
    video, audio = torch.randn(2, 128, 2, 2, 2, generator=g), torch.randn(2, 8, 9, 16, generator=g)
    cond = _cond(1)
    both = T.denoise(transformer, video, audio, 0.7, cond, 24.0)
    for i in range(2):
        alone = T.denoise(transformer, video[i:i + 1], audio[i:i + 1], 0.7, cond, 24.0)
        scale = float(alone[0].abs().max())
        assert (both[0][i:i + 1] - alone[0]).abs().max() <= 1e-5 * scale
        assert (both[1][i:i + 1] - alone[1]).abs().max() <= 1e-5 * float(alone[1].abs().max())


def test_a_conditioning_of_another_batch_size_names_the_node():
    """Three prompts for two latents: the sampler node refuses before loading the model, naming its input and
    saying how prompts and batches pair up."""
    from nodes.comfy.sampling import LTX25DistilledSampler
    video = {"samples": torch.zeros(2, 128, 2, 2, 2), "frame_rate": 24.0}
    audio = {"samples": torch.zeros(2, 8, 9, 16), "type": "audio", "frame_rate": 24.0}
    with pytest.raises(LTX25Error, match="LTX25DistilledSampler.conditioning.*prompts"):
        model = SimpleNamespace(info=SimpleNamespace(name="ltx-2.5-22b-distilled.safetensors"))  # never loaded
        LTX25DistilledSampler().sample(model, _cond(3), video, audio, 0, "1", "auto", 1.0)
