"""The tree marginals as one opaque operator, for ``torch.compile`` and ``torch.func``.

The marginals' fast path is checked a posteriori and only the failing problems are recomputed
(:func:`._matrix_tree.solve`): a data-dependent choice, read on the host. Registered as custom
operators (``torch.library.custom_op``), the whole solve is one node to the compiler (no graph
break; it runs eagerly inside) and one batched call to ``vmap`` (the vmapped dim is folded into
the batch). The backward is a second operator that recomputes the forward with the analytic VJP
(:class:`._matrix_tree._TreeMarginals`): exact, once differentiable, about twice the eager cost.
:class:`TracedMarginals` ties the two together with an autograd rule that torch.func accepts.
Eager calls do not go through here. Needs ``torch.library.custom_op`` and ``register_vmap``
(torch >= 2.4); without them :data:`AVAILABLE` is False and callers keep the eager path.
"""
from __future__ import annotations

from typing import Optional

import torch

from perturb._vmap import fold_vmap

AVAILABLE = all(hasattr(torch.library, f) for f in ("custom_op", "register_vmap"))


def _analytic(s: torch.Tensor, valid: torch.Tensor, nodes: Optional[torch.Tensor],
              root: int) -> torch.Tensor:
    from perturb.structured.trees._matrix_tree import analytic_marginals  # (import cycle)
    return analytic_marginals(s, valid, nodes, root)


if AVAILABLE:
    @torch.library.custom_op("perturb::tree_marginals", mutates_args=())
    def tree_marginals(s: torch.Tensor, valid: torch.Tensor, nodes: Optional[torch.Tensor],
                       root: int) -> torch.Tensor:
        return _analytic(s, valid, nodes, root).clone()

    @torch.library.custom_op("perturb::tree_marginals_backward", mutates_args=())
    def tree_marginals_backward(s: torch.Tensor, valid: torch.Tensor,
                                nodes: Optional[torch.Tensor], root: int,
                                grad: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = s.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(_analytic(x, valid, nodes, root), x, grad)
        return g

    @tree_marginals.register_fake
    def _(s, valid, nodes, root):
        return torch.empty_like(s)

    @tree_marginals_backward.register_fake
    def _(s, valid, nodes, root, grad):
        return torch.empty_like(s)

    # the scores (and the gradient) carry the vmapped dim; the edge and node masks broadcast
    def _vmap_forward(info, in_dims, *args):
        return fold_vmap(tree_marginals, info, in_dims, args, expand=(0,), broadcast=(1, 2))

    def _vmap_backward(info, in_dims, *args):
        return fold_vmap(tree_marginals_backward, info, in_dims, args, expand=(0, 4),
                         broadcast=(1, 2))

    torch.library.register_vmap(tree_marginals, _vmap_forward)
    torch.library.register_vmap(tree_marginals_backward, _vmap_backward)


class TracedMarginals(torch.autograd.Function):
    """The two operators with an autograd rule in the setup_context style (torch.func accepts
    it) and a vmap rule that folds the vmapped dim into the batch; under ``jacrev`` the backward
    operator is vmapped by its own rule."""

    @staticmethod
    def forward(s, valid, nodes, root):
        return tree_marginals(s, valid, nodes, root)

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, valid, nodes, root = inputs
        ctx.root, ctx.has_nodes = root, nodes is not None
        ctx.save_for_backward(s, valid, nodes if nodes is not None else s.new_empty(0))

    @staticmethod
    def backward(ctx, grad):
        s, valid, nodes = ctx.saved_tensors
        nodes = nodes if ctx.has_nodes else None
        return tree_marginals_backward(s, valid, nodes, ctx.root, grad), None, None, None

    @staticmethod
    def vmap(info, in_dims, *args):
        return fold_vmap(TracedMarginals.apply, info, in_dims, args, expand=(0,),
                         broadcast=(1, 2))
