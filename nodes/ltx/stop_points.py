"""Stop points inside one long forward: a check run before each block of a module, so a raised interrupt ends an
untiled decode, an upsample or a vocoder pass within one block rather than after the whole forward (seconds on a
large clip). The engine takes the check as a plain callable; the face passes the bridge's interrupt check."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

from torch import nn


@contextlib.contextmanager
def checked_before(blocks: Iterable[nn.Module], check: Callable[[], None] | None) -> Iterator[None]:
    """While inside, `check()` runs before every forward of each of `blocks` (what it raises ends the forward).
    Nothing is installed when `check` is None; each block gets its own forward back on every exit.

    The check wraps the block's `forward` (its class's, or one set on the instance, as the fused kernels do)
    rather than being a forward pre-hook: with any hook, `Module.__call__` runs the forward inside a closure whose
    cells hold the inputs, and a traceback keeps that closure alive even after `traceback.clear_frames`, so a
    stopped (or out-of-memory) decode would keep a block's input tensors until the exception is dropped."""
    saved = []
    try:
        for block in blocks if check is not None else ():
            saved.append((block, block.__dict__.get("forward")))
            block.forward = _checked(block.forward, check)
        yield
    finally:
        for block, own in reversed(saved):
            if own is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = own


def _checked(forward: Callable, check: Callable[[], None]) -> Callable:
    def checked_forward(*args, **kwargs):
        check()
        return forward(*args, **kwargs)
    return checked_forward
