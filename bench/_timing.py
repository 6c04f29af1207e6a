"""Timing helpers shared by the bench modules."""
from __future__ import annotations

import time
from typing import Callable

import torch


def time_ms(fn: Callable[[], object], *, repeat: int = 10, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds (CUDA synchronised when available)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def row(name: str, ours_ms: float | None, peer: str, peer_ms: float | None, note: str = "") -> dict:
    """One result row; ratio = ours / peer (lower is better for us)."""
    ratio = (ours_ms / peer_ms) if (ours_ms and peer_ms) else None
    return {"name": name, "ours_ms": ours_ms, "peer": peer, "peer_ms": peer_ms,
            "ratio": ratio, "note": note}
