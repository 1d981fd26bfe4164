"""LTX25_DECODE_STATS: what one decode cost, for the decoder A/B report."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class DecodeStats:
    decoder: str                       # "conv" or "diffusion"
    seconds: float
    peak_memory_bytes: int             # peak device memory during the decode (0 on the CPU)
    tile_count: int
    tile_sizes: tuple = ()             # per tile: (frames, height, width) in pixels
    processor: str = ""                # diffusion decoder: the attention processor used
    steps: int = 0                     # diffusion decoder: stage-5 steps
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)
