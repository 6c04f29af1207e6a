r"""Scaling iterations replayed from captured CUDA graphs (private; used by the absorbed-kernel
block of :mod:`perturb.structured.permutations._sinkhorn`).

One full iteration on the absorbed kernel K updates the column and then the row scalings::

    y ← b / Kᵀx,      x ← a / K y

optionally over-relaxed, x ← x^{1−ω} x_plain^{ω} (:func:`relaxed`). On a GPU one eager
iteration is 4 kernel launches whose host-side cost (~15 µs each) dominates the arithmetic; a
replayed graph launches a chunk of ``GRAPH_CHUNK`` iterations at once (measured on an H100:
64 µs → 8.7 µs per iteration at 64 x 128 x 128 float32).

The graph body is :func:`chunk_iterations`, a plain function of tensors: the captured graph runs
exactly it, and tests call it on the CPU with the same (column) layout to compare it with the
eager iterations.
"""
from __future__ import annotations

from typing import Any

import torch

#: iterations per captured graph (the engine sizes its CUDA blocks in whole chunks)
GRAPH_CHUNK = 10
_GRAPHS: dict = {}
_MAX_GRAPHS = 16


def relaxed(x: torch.Tensor, x_plain: torch.Tensor, omega: torch.Tensor,
            padded: bool) -> torch.Tensor:
    """The over-relaxed scaling update x^{1−ω} x_plain^{ω} = x (x_plain / x)^ω.

    ``padded``: some scalings are zero (padded rows or columns, whose marginal is 0); their
    ratio is read as 1, not 0/0 (a NaN that sent every over-relaxed block of a padded batch back
    to log space), so they stay zero, with finite gradients. The guard costs two more ops per
    update, so it is applied only to padded problems.
    """
    if not padded:
        return x * (x_plain / x).pow(omega)
    zero = x == 0
    return x * (x_plain / (x + zero) + zero).pow(omega)


def chunk_iterations(K: torch.Tensor, a: torch.Tensor, b: torch.Tensor, x: torch.Tensor,
                     y: torch.Tensor, omega: torch.Tensor | None, padded: bool,
                     n: int = GRAPH_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` full iterations (column update, then row update) in the column layout: the body of
    the captured graph.

    Shapes: K ``(*batch, n, m)``, row scalings x and marginal a ``(*batch, n, 1)``, column
    scalings y and marginal b ``(*batch, m, 1)``, ω ``(*batch, 1, 1)`` or None (plain updates).
    Returns the new (x, y).
    """
    Kt = K.mT
    for _ in range(n):
        y_plain = b / (Kt @ x)
        y = y_plain if omega is None else relaxed(y, y_plain, omega, padded)
        x_plain = a / (K @ y)
        x = x_plain if omega is None else relaxed(x, x_plain, omega, padded)
    return x, y


def graphed_iterations(K: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eu: torch.Tensor,
                       ev: torch.Tensor, omega: torch.Tensor | None, n_full: int,
                       padded: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run as many of ``n_full`` full iterations as fill whole chunks of ``GRAPH_CHUNK`` by
    replaying a captured CUDA graph of :func:`chunk_iterations`; returns (eu, ev, iterations
    done). Arguments as there, on a CUDA device, without autograd.

    Graphs are cached per (shape, dtype, device, over-relaxation, padding) and read/write
    static buffers, so results are identical to the eager iterations. Disable with
    ``perturb.settings(cuda_graphs=False)``.
    """
    chunks = n_full // GRAPH_CHUNK
    if chunks == 0:
        return eu, ev, 0
    key = (tuple(K.shape), K.dtype, K.device, omega is not None, padded)
    entry = _GRAPHS.get(key)
    if entry is None:
        if len(_GRAPHS) >= _MAX_GRAPHS:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        st: dict[str, Any] = {"K": K.clone(), "a": a.clone(), "b": b.clone(), "eu": eu.clone(),
              "ev": ev.clone(), "om": None if omega is None else omega.clone()}

        def body():
            x, y = chunk_iterations(st["K"], st["a"], st["b"], st["eu"], st["ev"], st["om"],
                                    padded)
            st["eu"].copy_(x)
            st["ev"].copy_(y)

        side = torch.cuda.Stream(device=K.device)
        side.wait_stream(torch.cuda.current_stream(K.device))
        with torch.cuda.stream(side):
            body()  # warm-up outside the capture (cuBLAS workspaces)
        torch.cuda.current_stream(K.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        entry = _GRAPHS[key] = (graph, st)
    graph, st = entry
    st["K"].copy_(K)
    st["a"].copy_(a)
    st["b"].copy_(b)
    st["eu"].copy_(eu)
    st["ev"].copy_(ev)
    if omega is not None:
        st["om"].copy_(omega)
    for _ in range(chunks):
        graph.replay()
    return st["eu"].clone(), st["ev"].clone(), chunks * GRAPH_CHUNK
