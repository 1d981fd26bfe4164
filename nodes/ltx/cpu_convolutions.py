"""Convolutions in float32 on the CPU, whatever the weights' dtype.

PyTorch's bfloat16 and float16 convolutions on the CPU have no fast kernel unless the CPU has native bfloat16
(AVX-512 BF16 or AMX): on an AVX2-only CPU one bfloat16 128→128 3×3×3 `conv3d` took 340× as long as in float32
(10.6 s against 0.031 s). ComfyUI core runs its VAEs in float32 on the CPU for the same reason
(`comfy.model_management.should_use_bf16`: "bf16 works on CPU but is extremely slow"). The pack's convolutional
models (video encoder, conv decoder, audio VAE and encoder, latent upsampler) keep their weights as loaded and compute
only each convolution in float32, rounding its output back to the input's dtype, so every other operation sees the
dtype it would see on a GPU.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch
from torch.overrides import TorchFunctionMode

# torch.nn.functional's convolutions are these same objects (what nn.Conv*d calls)
_CONVOLUTIONS = {torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                 torch.conv_transpose3d}
_HALF = (torch.bfloat16, torch.float16)


class _Float32Convolutions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else kwargs.get("input")
        if func not in _CONVOLUTIONS or not isinstance(x, torch.Tensor) or x.dtype not in _HALF \
                or x.device.type != "cpu":
            return func(*args, **kwargs)
        upcast = [a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args]
        upcast_kw = {k: v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF else v
                     for k, v in kwargs.items()}
        return func(*upcast, **upcast_kw).to(x.dtype)


def float32_convolutions(device: torch.device) -> ContextManager:
    """Around a VAE's forward: on the CPU, its half-precision convolutions compute in float32 (see the module's
    docstring); elsewhere nothing changes."""
    return _Float32Convolutions() if torch.device(device).type == "cpu" else nullcontext()
