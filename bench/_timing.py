"""Timing helpers shared by the bench modules.

The device is chosen once per run (``python -m bench --device cuda``) and read by every module
through :func:`device`. Besides wall time, :func:`count_ops` counts what one call dispatches
(torch.profiler: aten ops on the CPU, kernel launches on CUDA) and :func:`count_syncs` its host
synchronisations, the two costs that dominate small calls on a GPU.
"""
from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable, Iterator

import torch

_DEVICE = torch.device("cpu")


def set_device(name: str) -> None:
    """Select the device of every benchmark of this run ("cpu" or "cuda")."""
    global _DEVICE
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this machine")
    _DEVICE = dev


def device() -> torch.device:
    """The device of this run."""
    return _DEVICE


def _sync() -> None:
    if _DEVICE.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """A full collection first, then none inside the timed loop (as ``timeit`` does): a
    collection triggered by one library's garbage (POT's long loops) otherwise lands in
    whichever call comes next (measured: 4 -> 48 ms). Tensors are freed by reference
    counting; only cyclic garbage waits for the next collection (three epochs of the box
    trainer left none)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def time_ms(fn: Callable[[], object], *, repeat: int = 10, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds (synchronised on CUDA; no garbage
    collection inside the timed loop)."""
    for _ in range(warmup):
        fn()
    times = []
    with gc_paused():
        for _ in range(repeat):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def time_interleaved(fns: dict[str, Callable[[], object]], *, repeat: int = 10,
                     warmup: int = 2) -> dict[str, float]:
    """Median times of several functions measured in alternation (fair on a loaded machine)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    with gc_paused():
        for _ in range(repeat):
            for k, fn in fns.items():
                _sync()
                t0 = time.perf_counter()
                fn()
                _sync()
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def count_ops(fn: Callable[[], object]) -> int:
    """Work items one call of ``fn()`` dispatches: CUDA kernel launches on a GPU run, top-level
    aten ops on a CPU run (each would be at least one launch on a GPU)."""
    fn()  # warm caches (compilation, allocator)
    _sync()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if _DEVICE.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        _sync()
    events = prof.events()
    if _DEVICE.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    # aten ops called from Python (not nested inside another aten op)
    return sum(1 for e in events if e.name.startswith("aten::") and
               (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def count_syncs(fn: Callable[[], object]) -> int:
    """Host synchronisations of one call: ops that read a device value back to Python
    (``aten::_local_scalar_dense``: ``.item()``, ``bool(t)``, ``float(t)``) and explicit
    ``cudaDeviceSynchronize``/``cudaStreamSynchronize`` calls."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name in (
        "aten::_local_scalar_dense", "cudaDeviceSynchronize", "cudaStreamSynchronize"))


def row(name: str, ours_ms: float | None, peer: str, peer_ms: float | None, note: str = "",
        **extra) -> dict:
    """One result row; ratio = ours / peer (lower is better for us). ``extra`` keys (e.g.
    ``ops``, ``syncs``, ``gbps``) become columns of the table."""
    ratio = (ours_ms / peer_ms) if (ours_ms and peer_ms) else None
    return {"name": name, "ours_ms": ours_ms, "peer": peer, "peer_ms": peer_ms,
            "ratio": ratio, "note": note, **extra}
