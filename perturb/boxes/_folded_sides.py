"""The noise quadrature's engines as one node for ``torch.func``.

Inside a transform the quadrature's host reads (the grid sized from the widest side, the
regime tests) are impossible, and its general path computes every branch on the finest grid:
170 times the eager cost for per-example gradients of Normal boxes. This Function runs the
eager engine instead: its vmap rule folds the vmapped dim into the boxes' batch, so the engine
sees plain tensors and keeps its host reads, and its forward returns the derivatives of each
output with respect to its own corners (an output depends only on the corners of its batch
element, and a side only on those of its coordinate), so that the backward is a product the
transforms can batch. Values and gradients are those of the eager batched call. Once
differentiable, as the engines are.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from perturb._autograd import once_differentiable
from perturb.noise import Noise

Engine = Callable[..., torch.Tensor]


class _Folded(torch.autograd.Function):
    """``engine(*corners, noise)`` with the derivatives of its sum with respect to each of
    ``corners`` as extra outputs. ``dim`` 1: corners ``(m, *batch, d)``, outputs ``(*batch,
    d)`` (the log sides); 0: corners ``(*batch, d)``, outputs ``(*batch,)`` (a value per
    pair)."""

    @staticmethod
    def forward(engine: Engine, noise: Noise, dim: int, *corners: torch.Tensor) -> tuple:
        with torch.enable_grad():
            leaves = [c.detach().requires_grad_(True) for c in corners]
            out = engine(*leaves, noise)
            # the sum's gradient is each output's own: outputs share no corner
            grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
        return (out.detach(), *(torch.zeros_like(c) if g is None else g
                                for c, g in zip(corners, grads)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output[1:])
        ctx.dim = inputs[2]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple:
        g = grad.unsqueeze(0) if ctx.dim == 1 else grad.unsqueeze(-1)
        return (None, None, None, *(g * d for d in ctx.saved_tensors))

    @staticmethod
    def vmap(info: Any, in_dims: tuple, engine: Engine, noise: Noise, dim: int,
             *corners: torch.Tensor) -> tuple[tuple, tuple]:
        # the vmapped dim becomes the first batch dim (after the boxes' dim m when dim = 1)
        def fold(x: torch.Tensor, d: int | None) -> torch.Tensor:
            if d is not None:
                return x.movedim(d, dim)
            return x.unsqueeze(dim).expand(*x.shape[:dim], info.batch_size, *x.shape[dim:])

        out = _Folded.apply(engine, noise, dim, *(fold(c, d) for c, d in
                                                  zip(corners, in_dims[3:])))
        return out, (0, *(dim,) * len(corners))


def folded_log_sides(lo: torch.Tensor, up: torch.Tensor, noise: Noise, engine: Engine
                     ) -> torch.Tensor:
    """``engine(lo, up, noise)`` ``(*batch, d)`` for corners ``(m, *batch, d)`` through
    :class:`_Folded` (for callers inside a ``torch.func`` transform)."""
    return _Folded.apply(engine, noise, 1, lo, up)[0]


def folded_pairs(engine: Engine, noise: Noise, *corners: torch.Tensor) -> torch.Tensor:
    """``engine(*corners, noise)`` ``(*batch,)`` for corners ``(*batch, d)`` through
    :class:`_Folded`."""
    return _Folded.apply(engine, noise, 0, *corners)[0]
