"""Thread pools for work nobody downstream waits on while it runs (H.264 encodes, the A/B viewer's preview frames):
their threads run at a lower priority, so the graph's own threads — the one feeding the GPU, the compare — keep
their cores while the background work uses the idle ones."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

NICE = 10  # how much lower than the caller the pools' threads run (Linux: per thread, inherited by their threads)
PREVIEW_NICE = NICE + 5  # the viewer's frames yield to the saves: a file the run waits for before a picture
_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def lower_priority(nice: int = NICE, idle: bool = False) -> None:
    """Lower the calling thread's priority by `nice`; threads it starts later (x264's, a converter's) inherit it.
    `idle`: also Linux's SCHED_IDLE, so the thread runs on cores nothing else wants, not beside busy ones."""
    if not sys.platform.startswith("linux"):  # elsewhere the call renices a whole process, perhaps another one
        return
    with contextlib.suppress(OSError):  # not allowed
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))
        if idle:
            os.sched_setscheduler(me, os.SCHED_IDLE, os.sched_param(0))


def pool(name: str, workers: int = 8, nice: int = NICE, idle: bool = False) -> ThreadPoolExecutor:
    """The named background pool, created by the first call (later calls get it as it is). Each worker runs `nice`
    below the thread whose `submit` started it (and, with `idle`, only on idle cores: `lower_priority`). The threads
    are not daemons: pending work finishes before the interpreter exits."""
    with _LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"ltx25-{name}",
                                              initializer=functools.partial(lower_priority, nice, idle))
        return _POOLS[name]
