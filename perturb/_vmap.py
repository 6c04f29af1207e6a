"""``torch.func.vmap`` for autograd Functions that are batched already.

Every solver Function of the package treats the leading dims of its tensor arguments as batch
dims. Vmapping one therefore needs no per-op rule: move the vmapped dim of each argument to the
front (expanding the arguments that are not vmapped), call the Function once on the plain
tensors, and report dim 0 for the outputs. The forward then runs outside the transform, so
data-dependent steps inside it (convergence tests, fallbacks) keep working.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def fold_vmap(fn: type[torch.autograd.Function], batched: Sequence[int]):
    """A ``vmap`` staticmethod for ``fn``: positions ``batched`` are the tensor arguments with
    leading batch dims; the other arguments are passed through unchanged (they must not be
    vmapped). Outputs are tensors (or a tuple of tensors) with the batch dims leading."""
    batched = tuple(batched)

    def vmap(info: Any, in_dims: tuple, *args: Any):
        folded = list(args)
        for i, d in enumerate(in_dims):
            if d is not None and i not in batched:
                raise ValueError(f"{fn.__name__}: argument {i} cannot be vmapped")
        for i in batched:
            x, d = folded[i], in_dims[i]
            if not isinstance(x, torch.Tensor):
                continue
            folded[i] = (x.movedim(d, 0) if d is not None
                       else x.unsqueeze(0).expand(info.batch_size, *x.shape))
        out = fn.apply(*folded)
        dims = tuple(0 for _ in out) if isinstance(out, tuple) else 0
        return out, dims

    return staticmethod(vmap)
