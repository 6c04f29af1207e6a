"""``once_differentiable`` that refuses every second derivative it cannot give.

``torch.autograd.function.once_differentiable`` guards only the case where the incoming gradient
requires grad, and even then with a node detached from the inputs. A Hessian built with
``create_graph=True`` from a constant incoming gradient (``torch.autograd.functional.hessian``,
``torch.func.jacrev(jacrev(f))``, a gradient penalty on ``grad(loss, x, create_graph=True)``)
then treats the returned gradient as independent of the inputs: the second derivative comes out
silently zero. Here, when a graph of the gradient is being built, each returned gradient passes
through a node that is connected to the tensors the backward read (``ctx.saved_tensors``) and to
the incoming gradients, and raises when differentiated: the second derivative fails loudly.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

__all__ = ["once_differentiable"]


class _NoSecondDerivative(torch.autograd.Function):
    """Identity on a gradient ``g``; its backward raises (``name`` says which Function).
    ``deps``: the tensors ``g`` was computed from, so that the node lies on every path from
    the returned gradient back to them."""

    generate_vmap_rule = True

    @staticmethod
    def forward(g: torch.Tensor, name: str, *deps: torch.Tensor) -> torch.Tensor:
        return g.view_as(g)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.name = inputs[1]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(
            f"{ctx.name}: second derivatives are not implemented (its backward is once "
            f"differentiable); where the function offers backward='unroll', that path is "
            f"differentiable again")


def once_differentiable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the ``backward`` of an autograd Function whose gradient is not itself
    differentiable: it runs under ``no_grad``, and when a graph of the gradient is being built
    (``create_graph=True``, or a ``torch.func`` transform) differentiating the returned
    gradients raises a RuntimeError naming the Function (module docstring)."""
    name = fn.__qualname__.rsplit(".", 1)[0]

    @functools.wraps(fn)
    def wrapper(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            outputs = fn(ctx, *args, **kwargs)
        if not torch.is_grad_enabled():
            return outputs
        deps = [t for t in (*ctx.saved_tensors, *args)
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if not deps:
            return outputs
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        res = tuple(_NoSecondDerivative.apply(o, name, *deps)
                    if isinstance(o, torch.Tensor) else o for o in outs)
        return res if isinstance(outputs, tuple) else res[0]

    return wrapper
