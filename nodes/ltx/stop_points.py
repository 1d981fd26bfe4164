"""Stop points inside one long forward: a check run before each block of a module, so a raised interrupt ends an
untiled decode, an upsample or a vocoder pass within one block rather than after the whole forward (seconds on a
large clip). The engine takes the check as a plain callable; the face passes the bridge's interrupt check."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

from torch import nn


@contextlib.contextmanager
def checked_before(blocks: Iterable[nn.Module], check: Callable[[], None] | None) -> Iterator[None]:
    """While inside, `check()` runs before every forward of each of `blocks` (a forward pre-hook; what it raises
    ends the forward). Nothing is installed when `check` is None; the hooks are removed on every exit."""
    handles = [block.register_forward_pre_hook(lambda _module, _args: check()) for block in blocks] \
        if check is not None else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
