"""The pages of memory-mapped weight files, given back once a weight's bytes have been copied elsewhere.

safetensors' `safe_open` maps a file once, privately (MAP_PRIVATE, readable and writable), and each tensor it returns
is a view of that mapping (assets.read_state_dict, docs/PERFORMANCE.md "Host memory"). Every page a read touches is
then mapped into the process and counted in its resident set (RssFile, hence VmHWM and `ru_maxrss`) until the whole
mapping goes, which is when the file's last tensor is freed. Placing a model reads each weight once to copy it to
the device or into pinned host memory, so without more the whole file would stay counted until the placement ends,
beside the copies: Gemma-4's 24 GiB while it is placed next to the evicted transformer's 39 GiB of pinned copies.

`FileMappings.release(tensor)`, called once a view's bytes have been copied, drops the pages lying wholly inside the
view from the process (madvise MADV_DONTNEED), so the mapped file never counts for more than the tensor being copied.
Those pages are the page cache's; dropping them unmaps them and frees nothing the kernel keeps: the page cache holds
them for the next load of the same file, and a view that someone still reads (ComfyUI's backup of a patched weight,
put back into the module on unpatch) maps them again on its next touch, from the page cache or else from the file:
correct, at the cost of one page fault per page the first time it is read again. Weights that stay on the host and
are computed from in place are never copied, so never released.

A page written through a view (a LoRA merged in place into a weight on the CPU) is the process's private copy of it:
dropping it would bring the file's bytes back, so pages that /proc/self/pagemap shows as anonymous (or swapped) are
kept. Where pagemap cannot be read, no page of a private mapping is released; elsewhere than Linux nothing is.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import sys
from dataclasses import dataclass

import torch

PAGE = mmap.PAGESIZE
# /proc/self/pagemap: one 64-bit entry per page whose top bits are present (63), swapped (62) and file page or shared
# anonymous (61) (the kernel's Documentation/admin-guide/mm/pagemap.rst).
PRESENT, SWAPPED, FILE_PAGE = 4, 2, 1  # those bits shifted down by 61


def _libc_madvise():
    """libc's madvise with its argument types, or None where there is none to use (not Linux)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    function.restype = ctypes.c_int
    return function


_MADVISE = _libc_madvise()


@dataclass(frozen=True)
class Mapping:
    """One file-backed mapping of the process: its addresses and whether it is private (copy-on-write)."""
    start: int
    end: int
    private: bool


class FileMappings:
    """The process's file-backed mappings at one moment (/proc/self/maps). A tensor alive when they were read stays
    inside its mapping for as long as it lives, so one reading serves a whole placement of a model's tensors."""

    def __init__(self, mappings: list[Mapping]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        self._starts = [m.start for m in self.mappings]

    @classmethod
    def current(cls) -> "FileMappings":
        """The mappings now; none where pages cannot be released (not Linux, no /proc)."""
        if _MADVISE is None:
            return cls([])
        mappings = []
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:  # start-end perms offset dev inode [path]
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        mappings.append(Mapping(start, end, fields[1][3] == "p"))
        except (OSError, ValueError, IndexError):
            return cls([])
        return cls(mappings)

    def mapping_of(self, tensor: torch.Tensor) -> Mapping | None:
        """The file mapping holding all of a CPU tensor's bytes, or None (not file-backed, not on the CPU)."""
        if tensor.device.type != "cpu" or not self.mappings or not tensor.numel():
            return None
        start = tensor.data_ptr()
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            return None
        mapping = self.mappings[i]
        end = start + tensor.numel() * tensor.element_size()
        return mapping if end <= mapping.end else None

    def release(self, tensor: torch.Tensor) -> int:
        """Drop the pages wholly inside a file-mapped, contiguous tensor's bytes from the process (module docstring:
        the tensor stays readable, its pages come back on the next touch); pages written through a view are kept.
        Call it once the bytes have been copied. Returns the bytes advised (0 when nothing could be)."""
        mapping = self.mapping_of(tensor)
        if mapping is None or not tensor.is_contiguous():
            return 0
        first = -(-tensor.data_ptr() // PAGE) * PAGE  # the partial pages at either end hold other tensors' bytes
        last = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // PAGE * PAGE
        if last <= first:
            return 0
        released = 0
        for start, end in [(first, last)] if not mapping.private else _unwritten_runs(first, last):
            if _MADVISE(start, end - start, mmap.MADV_DONTNEED) == 0:  # fails only on locked or special pages
                released += end - start
        return released


def _unwritten_runs(first: int, last: int) -> list[tuple[int, int]]:
    """The address runs in [first, last) holding no page of the process's own (a private mapping's page written to:
    anonymous, or swapped out); none when pagemap cannot be read."""
    pages = (last - first) // PAGE
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            raw = os.pread(fd, pages * 8, first // PAGE * 8)
        finally:
            os.close(fd)
    except OSError:
        return []
    if len(raw) != pages * 8:
        return []
    top = (torch.frombuffer(bytearray(raw), dtype=torch.int64) >> 61) & 7
    own = ((top & (PRESENT | FILE_PAGE)) == PRESENT) | ((top & SWAPPED) != 0)
    if not bool(own.any()):
        return [(first, last)]
    kept = torch.nonzero(own).flatten().tolist()
    runs, start = [], 0
    for page in kept:
        if page > start:
            runs.append((first + start * PAGE, first + page * PAGE))
        start = page + 1
    if start < pages:
        runs.append((first + start * PAGE, last))
    return runs
