"""Interrupts: ComfyUI's own request and check, or their standalone twins for the headless runner."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from .comfyui import HAS_COMFY, _mm

if HAS_COMFY:
    InterruptError = _mm.InterruptProcessingException
else:
    class InterruptError(Exception):
        """Standalone twin of ComfyUI's InterruptProcessingException."""

_interrupt_requested = False
_run_holds_interrupt = False  # inside `interrupt_scope` a request stays set: every check in the run stops


def request_interrupt() -> None:
    """Ask the running loop to stop at its next step (ComfyUI: POST /interrupt does this)."""
    global _interrupt_requested
    if HAS_COMFY:
        _mm.interrupt_current_processing(True)
    else:
        _interrupt_requested = True


def check_interrupt() -> None:
    """Raise InterruptError when an interrupt was requested. Outside a run the request is used up by the check
    that raises (as ComfyUI's); inside `interrupt_scope` it stays until the run ends, so a save encoding on its
    thread cannot use it up while the node being computed goes on."""
    global _interrupt_requested
    if HAS_COMFY:
        _mm.throw_exception_if_processing_interrupted()
    elif _interrupt_requested:
        if not _run_holds_interrupt:
            _interrupt_requested = False
        raise InterruptError("Processing interrupted")


@contextlib.contextmanager
def interrupt_scope() -> Iterator[None]:
    """One headless run. A request left from before (one that landed where nothing checked it, or while idle) is
    dropped at the start, as ComfyUI's executor does for each prompt, so it cannot stop the next run; inside,
    a request stops every check until the run ends, when it is dropped again."""
    global _interrupt_requested, _run_holds_interrupt
    if HAS_COMFY:
        _mm.interrupt_current_processing(False)
        yield
        return
    _interrupt_requested, _run_holds_interrupt = False, True
    try:
        yield
    finally:
        _interrupt_requested, _run_holds_interrupt = False, False


class TaskCheck:
    """The check for a node's work on a worker thread: call it between steps. It raises InterruptError once `stop()`
    was called (the node's task was cancelled: a later node failed, the run stopped; that cannot stop a thread, so
    the work stops itself at its next check), else runs `check`, the run's interrupt check the node passes
    (`bridge.check_interrupt`)."""

    def __init__(self, why: str, check: Callable[[], None]) -> None:
        self.why, self.check = why, check
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def __call__(self) -> None:
        if self._stopped.is_set():
            raise InterruptError(self.why)
        self.check()

