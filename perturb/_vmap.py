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


def fold_random_vmap(call: Callable[..., Any], info: Any, in_dims: Sequence[int | None],
                     args: Sequence[Any], *, expand: Sequence[int], broadcast: Sequence[int] = (),
                     generator: torch.Generator | None = None, out_dim: int = 0
                     ) -> tuple[Any, Any]:
    """:func:`fold_vmap` for a sampler, honouring ``vmap``'s ``randomness``.

    - ``"different"``: the vmapped dim folded into the batch, as :func:`fold_vmap` (one call:
      every problem draws its own noise);
    - ``"same"``: every vmapped problem draws the same random numbers: one call per problem,
      each from the same state of the generator (``generator``, else the default generator of
      the scores' device), which is left where one call leaves it;
    - ``"error"`` (vmap's default): the RuntimeError torch raises for its own random ops.

    ``out_dim``: where the vmapped dim lands in the output (after a leading sample dim, 1).
    """
    randomness = getattr(info, "randomness", "error")
    if randomness == "error":
        raise RuntimeError("vmap: called a random operation while in randomness error mode; "
                           "use vmap(..., randomness='different') or randomness='same'")
    if randomness == "different":
        out, _ = fold_vmap(call, info, in_dims, args, expand=expand, broadcast=broadcast)
        return out, out_dim
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    gen = generator if generator is not None else _default_generator(device)
    start = gen.get_state()
    outs = []
    for b in range(info.batch_size):
        one = [a.select(d, b) if isinstance(a, torch.Tensor) and d is not None else a
               for a, d in zip(args, in_dims)]
        gen.set_state(start)
        outs.append(call(*one))
    return torch.stack(outs, out_dim), out_dim


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return torch.default_generator
