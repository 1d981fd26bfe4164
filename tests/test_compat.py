"""Touches below diffusers' public API live in nodes/ltx/compat.py and are checked against the installed diffusers."""
from __future__ import annotations

import os
import re

import pytest
import torch

from nodes.ltx import compat
from nodes.ltx.errors import LTX25Error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# how the decode side used to reach into diffusers: a private method, a forward bound onto an instance, a class
# recognised by its name, the decoder's stage internals
PRIVATE_TOUCHES = re.compile(r"\._inv_freqs\b|MethodType|__dict__|__name__ ==|\.trailing_pad_latent_frames\b|"
                             r"\.det_stages\b|\.upsamples\[|_compiled_call_impl")


def test_a_diffusers_without_what_the_pack_touches_is_refused_by_name():
    """A rotary module without `_inv_freqs` (a diffusers that renamed it) is an LTX25Error naming the installed
    diffusers, the attribute and the range the pack was written for — not an AttributeError inside a decode."""
    class RenamedRope(torch.nn.Module):
        rope_dim_split = (16, 24, 24)

    with pytest.raises(LTX25Error) as info:
        compat.rope_inv_freqs(RenamedRope(), 16, torch.device("cpu"))
    message = str(info.value)
    assert info.value.where.startswith("diffusers ") and "RenamedRope._inv_freqs" in message
    assert compat.WRITTEN_FOR in message


def test_decode_kernel_and_dit_modules_reach_into_diffusers_only_through_compat():
    """The decode side, the kernels and the DiT call compat for every private touch: one place to check and update
    when diffusers or torch changes."""
    found = []
    for folder in ("decode", "kernels", "dit"):
        directory = os.path.join(ROOT, "nodes", "ltx", folder)
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                for number, line in enumerate(open(os.path.join(directory, name), encoding="utf-8"), 1):
                    if PRIVATE_TOUCHES.search(line.split("#")[0]):
                        found.append(f"{folder}/{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
