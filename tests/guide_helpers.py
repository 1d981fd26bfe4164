"""What the conditioning tests share (tests/test_guides.py, test_guide_nodes.py, test_reference_video.py): seeded
random latents, a stand-in DiT for the sampler node, and a recorder of the tiny DiT's inputs."""
from __future__ import annotations

import contextlib
import sys
import types
from types import SimpleNamespace
from typing import Iterator

import torch

from nodes.comfy import bridge
from nodes.comfy.handles import Loaded
from nodes.ltx.files.lora import ReferenceScales


def randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class StandInDiT(torch.nn.Module):
    """Stands in for the DiT: a fixed function of its input, so held values are the only exact ones; `calls` records
    each denoise's video shape and guided stage."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.model_version, self.calls = "2.5.0", []

    def denoise(self, model, video, audio, sigma, cond, fps, guided=None):
        self.calls.append((video.shape, guided))
        return 0.5 * torch.tanh(video.float()), 0.7 * torch.sin(audio.float())


def stand_in_model(monkeypatch, reference: ReferenceScales = ReferenceScales(), loras: tuple[str, ...] = ()) -> Loaded:
    """An LTX25_MODEL handle whose sampling calls `StandInDiT.denoise` (the sampler imports the transformer module's
    `denoise` when it runs, so that module is replaced for the test)."""
    model = StandInDiT()
    monkeypatch.setitem(sys.modules, "nodes.ltx.dit.transformer", types.SimpleNamespace(denoise=model.denoise))
    return Loaded(model, bridge.make_patcher(model), SimpleNamespace(name="ltx-2.5-22b-distilled.safetensors"),
                  reference, loras)


@contextlib.contextmanager
def dit_inputs(transformer) -> Iterator[list[dict]]:
    """Every DiT forward's keyword inputs, recorded by a forward pre-hook (the model itself still runs)."""
    calls: list[dict] = []

    def record(_module, _args, kwargs):
        calls.append({k: v.detach().clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    handle = transformer.dit.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()
