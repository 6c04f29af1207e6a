"""``torch.func.vmap`` for solvers that are batched already.

Every solver of the package treats leading dims of its tensor arguments as batch dims. Vmapping
one needs no per-op rule: move the vmapped dim of each argument to the front, call the solver
once on the plain tensors, and report dim 0 for its outputs. The forward then runs outside the
transform, so its data-dependent steps (convergence tests, fallbacks) keep working. Used by the
``vmap`` staticmethods of autograd Functions and by ``torch.library.register_vmap`` rules.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def fold_vmap(call: Callable[..., Any], info: Any, in_dims: Sequence[int | None],
              args: Sequence[Any], *, expand: Sequence[int], broadcast: Sequence[int] = (),
              unbatched_outputs: Sequence[int] = ()) -> tuple[Any, Any]:
    """A vmap rule: ``call(*args)`` with the vmapped dim leading in its arguments.

    Example, in an autograd Function::

        @staticmethod
        def vmap(info, in_dims, *args):
            return fold_vmap(MyFunction.apply, info, in_dims, args, expand=(0,))

    Args:
        call: the batched solver (``Function.apply`` or a custom operator).
        info, in_dims, args: those of the vmap rule.
        expand: positions of the tensors that carry the batch dims (the scores, a gradient):
            they always get the vmapped dim, expanded when they are not vmapped, so every
            output has it.
        broadcast: positions of tensors that broadcast against the batch (masks, marginals,
            temperatures of shape ``(*batch, 1, 1)``): moved when vmapped, else left as they are.
            Vmapping any other argument is a ValueError.
        unbatched_outputs: positions of outputs without batch dims (e.g. an iteration count).

    Returns:
        ``(output, out_dims)`` as a vmap rule returns them.
    """
    folded = list(args)
    for i, d in enumerate(in_dims):
        if d is not None and i not in expand and i not in broadcast:
            raise ValueError(f"{getattr(call, '__name__', call)}: argument {i} cannot be "
                             f"vmapped")
    for i, x in enumerate(args):
        if not isinstance(x, torch.Tensor):
            continue
        d = in_dims[i] if i < len(in_dims) else None
        if d is not None:
            folded[i] = x.movedim(d, 0)
        elif i in expand:
            folded[i] = x.unsqueeze(0).expand(info.batch_size, *x.shape)
    out = call(*folded)
    if not isinstance(out, tuple):
        return out, 0
    return out, tuple(None if j in unbatched_outputs else 0 for j in range(len(out)))
