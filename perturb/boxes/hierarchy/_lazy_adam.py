"""Lazy Adam for sparse row gradients (private to the hierarchy trainer, the
``HierarchyConfig.optimizer="sparse_adam"`` option).

The update rule is ``torch.optim.SparseAdam``'s: at step t (the optimizer's step count, one per
``step()`` with a gradient), for the rows R that the sparse gradient g touches (its repeated
rows summed) and only for them,

    m_R ← β₁ m_R + (1 − β₁) g_R,      v_R ← β₂ v_R + (1 − β₂) g_R²,
    θ_R ← θ_R − lr · √(1 − β₂ᵗ) / (1 − β₁ᵗ) · m_R / (√v_R + ε);

every other row keeps its parameters *and its moments* (they do not decay, unlike dense Adam,
whose zero-gradient rows still move by their decaying first moment). Same values as
``torch.optim.SparseAdam`` up to float rounding, 1.8–2.1× faster than it on the trainer's
gradients (11,264 gathered rows of two 82,115 × 10 tables, one CPU thread, medians of 60
steps): the touched rows are found by marking a flag per row instead of sorting (SparseAdam's
``coalesce``), the rows are gathered, updated and written back once per tensor instead of
through sparse additions, and the rows found for one parameter are reused for the next when
its gradient has the same indices (the trainer's two corner tables). On that CPU it is still
2–3× slower than the dense fused Adam together with the dense gradient it needs (2.4–3.0 ms
against 5.1–8.8 ms a step): the dense pass streams through memory, the lazy one reads and
writes ~6,000 scattered rows of six tables (docs/box_hierarchy.md, "Lazy (sparse) Adam").
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

__all__ = ["LazyAdam"]


class LazyAdam(torch.optim.Optimizer):
    """Lazy Adam (module docstring) for parameters whose gradients are sparse COO tensors
    (``(n, *rest)``, sparse along the first dimension, coalesced or not).

    Args:
        params: the parameters (or parameter groups).
        lr: learning rate (> 0).
        betas: ``(β₁, β₂)`` in [0, 1).
        eps: ε > 0, added to √v (not to the bias-corrected √v̂, as in SparseAdam).

    State per parameter, as SparseAdam's: ``step`` (int), ``exp_avg`` (m) and ``exp_avg_sq``
    (v), dense tensors of the parameter's shape; ``state_dict()`` round trips it exactly.

    Raises:
        ValueError: a bad hyper-parameter (naming it), or a dense gradient at ``step()``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One lazy Adam update of the rows that each parameter's gradient touches."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not g.is_sparse:
                    raise ValueError("optimizer='sparse_adam' needs sparse row gradients (the "
                                     "hierarchy model's gathers with sparse_grad=True); got a "
                                     "dense gradient")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.preserve_format)
                state["step"] += 1
                idx, val = g._indices()[0], g._values()
                if rows is None or not (rows[0].shape == idx.shape and torch.equal(rows[0], idx)):
                    rows = (idx, *_touched_rows(idx, p.shape[0]))
                u, inv = rows[1], rows[2]
                grad = val.new_zeros((u.shape[0],) + tuple(p.shape[1:]))
                grad.index_put_((inv,), val, accumulate=True)       # repeated rows summed
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                m = exp_avg.index_select(0, u).lerp_(grad, 1.0 - b1)
                v = exp_avg_sq.index_select(0, u).mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
                exp_avg.index_put_((u,), m)
                exp_avg_sq.index_put_((u,), v)
                t = state["step"]
                step_size = lr * math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
                # a gather and a write, not index_add_ (several times slower on the CPU)
                p.index_put_((u,), p.index_select(0, u).sub_(m / v.sqrt().add_(eps),
                                                              alpha=step_size))
        return loss


def _touched_rows(idx: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, inverse)``: the distinct values of ``idx`` (ids in [0, n)), ascending, and each
    entry's position among them (``rows[inverse] == idx``). A flag per row and ``nonzero``
    instead of a sort: about 2× faster than ``torch.unique`` for ~10⁴ ids among ~10⁵ rows."""
    flag = torch.zeros(n, dtype=torch.bool, device=idx.device)
    flag[idx] = True
    rows = flag.nonzero().squeeze(1)
    where = torch.empty(n, dtype=torch.long, device=idx.device)
    where[rows] = torch.arange(rows.shape[0], device=idx.device)
    return rows, where.index_select(0, idx)
