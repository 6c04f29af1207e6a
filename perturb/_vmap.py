"""``torch.func.vmap`` for autograd Functions that are batched already.

Every solver Function of the package treats leading dims of its tensor arguments as batch dims.
Vmapping one needs no per-op rule: move the vmapped dim of each argument to the front, call the
Function once on the plain tensors, and report where the vmapped dim sits in the outputs. The
forward then runs outside the transform, so its data-dependent steps (convergence tests,
fallbacks) keep working. Two layouts:

- *prepend* (the Function takes any number of leading batch dims): the vmapped dim becomes one
  more leading dim; arguments that are not vmapped are passed as they are (they broadcast).
- *flatten* (the Function takes exactly one batch dim, ``(B, ...)``): the vmapped dim is merged
  into it, ``(V·B, ...)``; arguments that are not vmapped are expanded first.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def fold_vmap(fn: type[torch.autograd.Function], info: Any, in_dims: tuple[int | None, ...],
              args: tuple[Any, ...], *, batched: Sequence[int], flatten: bool = False,
              unbatched_outputs: Sequence[int] = ()) -> tuple[Any, Any]:
    """The ``vmap`` rule of ``fn``, called from its ``vmap`` staticmethod::

        @staticmethod
        def vmap(info, in_dims, *args):
            return fold_vmap(MyFunction, info, in_dims, args, batched=(0,))

    Args:
        fn: the Function.
        info, in_dims, args: those of ``Function.vmap``.
        batched: positions of the tensor arguments that carry the batch dims; the other
            arguments must not be vmapped (ValueError).
        flatten: the *flatten* layout (see the module docstring); else *prepend*.
        unbatched_outputs: positions of outputs without batch dims (e.g. an iteration count).

    Returns:
        ``(output, out_dims)`` as ``Function.vmap`` returns them.
    """
    batched, skip = tuple(batched), tuple(unbatched_outputs)
    folded = list(args)
    for i, d in enumerate(in_dims):
        if d is not None and i not in batched:
            raise ValueError(f"{fn.__name__}: argument {i} cannot be vmapped")
    rows = None
    for i in batched:
        x, d = folded[i], in_dims[i]
        if not isinstance(x, torch.Tensor):
            continue
        if d is not None:
            x = x.movedim(d, 0)
        elif flatten:
            x = x.unsqueeze(0).expand(info.batch_size, *x.shape)
        else:
            continue
        if flatten:
            rows = x.shape[1]
            x = x.flatten(0, 1)
        folded[i] = x
    out = fn.apply(*folded)
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    dims = tuple(None if j in skip else 0 for j in range(len(outs)))
    if flatten:
        outs = tuple(o if j in skip else o.unflatten(0, (info.batch_size, rows))
                     for j, o in enumerate(outs))
    return (outs[0], dims[0]) if single else (outs, dims)
