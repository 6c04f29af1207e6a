r"""The transport polytope: plans with given marginals, their exact argmax and relaxations.

For row marginals a ∈ R^n and column marginals b ∈ R^m (a, b ≥ 0, Σa = Σb) the transport
polytope is

.. math::

    U(a, b) = \{P \in \mathbb{R}^{n \times m} : P \ge 0,\ P1 = a,\ P^\top 1 = b\},

and Z is the set of its vertices: the feasible plans whose support, read as edges between rows
and columns, is a forest (at most n + m − 1 nonzero entries). For n = m and a = b = 1 the
vertices are the permutation matrices and U is the Birkhoff polytope (:class:`Permutations`).

- Exact argmax: argmax_{P ∈ U(a,b)} ⟨w, P⟩ is optimal transport with cost −w, a vertex, found by
  the network simplex of POT (``ot.emd(a, b, -w)``; Bonneel et al. 2011). It runs on the CPU in
  float64, one problem at a time: a Python loop over the batch elements, because this is an
  exact combinatorial LP solver with no batched torch equivalent (as :func:`matching`). POT is
  imported on first use.
- :class:`~perturb.Entropy`: argmax ⟨w, P⟩ + τ H(P), H(P) = −Σ P log P, is entropic optimal
  transport, solved by :func:`sinkhorn` with the marginals a, b: POT's
  ``ot.sinkhorn(a, b, M=-w, reg=tau)``. As τ → 0 the plan converges to the optimal plan of
  maximal entropy (the ``ot.emd`` plan when the optimum is unique), the limit POT users expect.
  Gradients reach w, τ and (``backward="implicit"``) a and b.
- :class:`~perturb.SquaredNorm` is registered as unsupported: the Euclidean projection onto
  U(a, b) is a quadratic program with no closed form (unlike the simplex or the capped simplex)
  and is not implemented; :class:`~perturb.ExpFamilyEntropy` is unsupported because its
  marginals include permanents (a = b = 1), which are #P-hard.

Zero entries of a or b are allowed (empty rows or columns): the relaxation then solves the
problem on the rows and columns with positive mass (a mask for :func:`sinkhorn`) and returns
zeros elsewhere.

References: Peyré & Cuturi, "Computational optimal transport" (arXiv:1803.00567), §3.4–3.5 (the
network simplex, vertices of U(a, b)) and §4 (Sinkhorn); Bonneel, van de Panne, Paris &
Heidrich, "Displacement interpolation using Lagrangian mass transport", SIGGRAPH Asia 2011.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from perturb import _validation
from perturb._validation import broadcasts_to, check_int, check_scores, check_value
from perturb.regularizers import Entropy, ExpFamilyEntropy, Regularizer, SquaredNorm
from perturb.structured.permutations.matrix_scaling import SINKHORN_BACKWARD, _check_tol, sinkhorn
from perturb.structures import Structure, register_solver, register_unsupported

__all__ = ["Transport"]

#: enumerate() refuses problems with more candidate bases than this (tests use tiny n, m)
_MAX_BASES = 200_000


def _sum_rtol(*xs: torch.Tensor) -> float:
    """Relative tolerance of the equal-mass check (as :func:`sinkhorn`'s)."""
    low = (torch.float16, torch.bfloat16, torch.float32)
    return 1e-4 if any(x.dtype in low for x in xs) else 1e-8


def _check_marginal(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating torch.Tensor of shape (*batch, size) (a "
                         f"histogram of masses), got {got}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (*batch, size) with size >= 1, got shape "
                         f"{tuple(x.shape)}")
    if _validation.validation_enabled():
        with torch.no_grad():
            good = torch.isfinite(x) & (x >= 0)
            check_value(good.all(), f"{name} must be finite and >= 0 (masses)",
                        lambda: repr(x.detach()[~good].flatten()[0].item()))
            check_value((x.sum(-1) > 0).all(), f"{name} must have a positive total mass in "
                        f"every problem")
    return x


def _incidence(n: int, m: int) -> torch.Tensor:
    """The (n + m, n·m) 0/1 matrix of the constraints P1 = a, Pᵀ1 = b on the flattened plan."""
    cells = torch.arange(n * m)
    A = torch.zeros(n + m, n * m, dtype=torch.float64)
    A[cells // m, cells] = 1.0
    A[n + cells % m, cells] = 1.0
    return A


class Transport(Structure):
    r"""Transport plans with marginals a, b: the vertices of U(a, b) = {P ≥ 0 : P1 = a, Pᵀ1 = b}.

    ``argmax`` is the optimal plan for cost −w by POT's network simplex (``ot.emd``, CPU, one
    problem at a time); the default regularizer :class:`~perturb.Entropy` gives the entropic
    plan by :func:`sinkhorn` with these marginals (backward ``"implicit"`` or ``"unroll"``), so
    ``relax(w, Transport(a, b), Gumbel(), tau=0.1)`` is a perturbed, relaxed transport plan.
    SquaredNorm and ExpFamilyEntropy are registered as unsupported (module docstring).

    Args:
        a: row marginals ``(*batch, n)``, finite and >= 0, a positive total in every problem.
        b: column marginals ``(*batch, m)``, same conditions, Σb = Σa (relative tolerance 1e-8
            in float64, 1e-4 in lower precision). The batch dims of a and b broadcast against
            each other and against the scores'.
        n_iters: iteration cap of the registered Sinkhorn solver.
        tol: marginal-error tolerance of the registered Sinkhorn solver.

    Shape: scores ``(*batch, n, m)``; vertices ``(*batch, n, m)``, dtype and device of the
    scores. a and b may require gradients: the relaxation differentiates them.

    Raises:
        ValueError: a or b not floating tensors, empty, negative, non-finite, with a zero total
            or different totals, batch shapes that do not broadcast; ``n_iters`` < 1,
            ``tol`` < 0. Scores of another shape than ``(*batch, n, m)`` are rejected when they
            arrive (``validate``).

    Example::

        >>> from perturb import relax
        >>> a, b = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.25, 0.5])
        >>> w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        >>> Transport(a, b).argmax(w)
        tensor([[0.2500, 0.2500, 0.0000],
                [0.0000, 0.0000, 0.5000]])
        >>> P = relax(w, Transport(a, b), tau=0.1)        # a perturbed entropic plan
        >>> torch.allclose(P.sum(-1), a, atol=1e-5) and torch.allclose(P.sum(-2), b, atol=1e-5)
        True
    """

    event_dim = 2

    def __init__(self, a: torch.Tensor, b: torch.Tensor, n_iters: int = 1000,
                 tol: float = 1e-6):
        a = _check_marginal(a, "a")
        b = _check_marginal(b, "b")
        try:
            torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        except RuntimeError:
            raise ValueError(f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)} have "
                             f"batch shapes that do not broadcast") from None
        if _validation.validation_enabled():
            with torch.no_grad():
                sa, sb = a.sum(-1), b.sum(-1)
                bad = (sa - sb).abs() > _sum_rtol(a, b) * torch.maximum(sa, sb)
                check_value(~bad.any(), "a and b must have equal sums (total mass)",
                            lambda: f"sum(a) = {sa.expand_as(bad)[bad].flatten()[0].item():.6g} "
                                    f"and sum(b) = {sb.expand_as(bad)[bad].flatten()[0].item():.6g}")
        self.a = a
        self.b = b
        self.n_iters = check_int(n_iters, "n_iters", low=1)
        self.tol = _check_tol(tol)
        # empty rows/columns (zero mass) become a mask for sinkhorn; one host read, here
        with torch.no_grad():
            if bool((a > 0).all()) and bool((b > 0).all()):
                self._mask = None
            else:
                self._mask = (a > 0).unsqueeze(-1) & (b > 0).unsqueeze(-2)

    @property
    def sizes(self) -> tuple[int, int]:
        """The numbers of rows and columns ``(n, m)`` of the plans."""
        return self.a.shape[-1], self.b.shape[-1]

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        """Scores must be floating and finite, of shape ``(*batch, n, m)`` with the marginals'
        sizes, and the marginals' batch dims must broadcast to the scores'."""
        check_scores(w, name, min_ndim=2)
        n, m = self.sizes
        if tuple(w.shape[-2:]) != (n, m):
            raise ValueError(f"{name} must have shape (*batch, n, m) = (*batch, {n}, {m}) to "
                             f"match the marginals a (size n = {n}) and b (size m = {m}), got "
                             f"shape {tuple(w.shape)}")
        for x, xname in ((self.a, "a"), (self.b, "b")):
            if not broadcasts_to(x.shape[:-1], w.shape[:-2]):
                raise ValueError(f"{xname} of shape {tuple(x.shape)} must broadcast to the batch "
                                 f"shape {tuple(w.shape[:-2])} of {name} (shape "
                                 f"{tuple(w.shape)})")

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        """The optimal plan argmax_{P ∈ U(a,b)} ⟨w, P⟩ (a vertex), by ``ot.emd(a, b, -w)``.

        float64 on the CPU, one problem at a time (a loop over the batch: an exact LP solver);
        b is rescaled to Σa in float64 first, so that rounding of the masses cannot make the
        problem infeasible, and the cost −w is shifted to be nonnegative (POT's simplex can
        report negative-cost problems as infeasible). Not differentiable (piecewise constant). Raises RuntimeError if the
        network simplex stops before optimality.
        """
        import ot  # imported on first use: POT is only needed for exact plans

        self.validate(w)
        n, m = self.sizes
        batch = w.shape[:-2]
        # cost −w shifted to be >= 0 per problem (a constant on U(a, b): same optimum). POT's
        # network simplex reports 1 x 1 problems with costs below about −2 as infeasible
        w64 = w.detach().to("cpu", torch.float64).reshape(-1, n, m)
        cost = (w64.amax((-2, -1), keepdim=True) - w64).numpy()
        a = self.a.detach().to("cpu", torch.float64).expand(*batch, n).reshape(-1, n).numpy()
        b = self.b.detach().to("cpu", torch.float64).expand(*batch, m).reshape(-1, m).numpy()
        out = np.zeros_like(cost)
        max_iter = max(100_000, 100 * n * m)
        for k in range(cost.shape[0]):
            ak, bk = a[k], b[k] * (a[k].sum() / b[k].sum())
            plan, log = ot.emd(ak, bk, np.ascontiguousarray(cost[k]), numItermax=max_iter,
                               log=True)
            if log["result_code"] != 1:
                raise RuntimeError(f"ot.emd (network simplex) did not reach the optimum: "
                                   f"{log['warning']}")
            out[k] = plan
        return torch.from_numpy(out).reshape(w.shape).to(device=w.device, dtype=w.dtype)

    def _atol(self, dtype: torch.dtype) -> float:
        n, m = self.sizes
        mass = float(self.a.detach().sum(-1).abs().max())
        return 8 * max(n, m) * torch.finfo(dtype).eps * max(mass, 1.0)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        """Whether each ``y`` is a vertex of U(a, b): nonnegative, marginals a and b (to a few
        ulps of the total mass), support a forest (its columns of the constraint matrix are
        linearly independent)."""
        n, m = self.sizes
        if y.ndim < 2 or tuple(y.shape[-2:]) != (n, m):
            return torch.zeros(y.shape[:-2] if y.ndim >= 2 else (), dtype=torch.bool,
                               device=y.device)
        atol = self._atol(y.dtype)
        a = self.a.detach().to(y.device, y.dtype)
        b = self.b.detach().to(y.device, y.dtype)
        ok = (y >= -atol).all(-1).all(-1)
        ok = ok & ((y.sum(-1) - a).abs() <= atol).all(-1) & ((y.sum(-2) - b).abs() <= atol).all(-1)
        support = (y > atol).flatten(-2).to(torch.float64)
        A = _incidence(n, m).to(y.device)
        rank = torch.linalg.matrix_rank(A * support.unsqueeze(-2))
        return ok & (rank == support.sum(-1).to(rank.dtype))

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All vertices of U(a, b), ``(V, n_rows, m)``, for unbatched a, b and tiny sizes.

        ``n`` must be m, the number of columns (the sizes are fixed by a and b). Every basis (a
        set of n_rows + m − 1 cells whose constraint columns are independent, a spanning tree
        of the bipartite graph) with a nonnegative solution gives a vertex; degenerate
        vertices are listed once. Brute force over all C(n_rows·m, n_rows + m − 1) cell sets.
        """
        rows, m = self.sizes
        if self.a.ndim != 1 or self.b.ndim != 1:
            raise ValueError(f"enumerate needs unbatched marginals a (n,) and b (m,), got shapes "
                             f"{tuple(self.a.shape)} and {tuple(self.b.shape)}")
        n = check_int(n, "n", low=1)
        if n != m:
            raise ValueError(f"n must be the number of columns m = {m} fixed by b, got n={n}")
        cells, r = rows * m, rows + m - 1
        if math.comb(cells, r) > _MAX_BASES:
            raise ValueError(f"enumerate is for tiny problems: {rows} x {m} plans have "
                             f"{math.comb(cells, r)} candidate bases (at most {_MAX_BASES})")
        A = _incidence(rows, m)
        rhs = torch.cat([self.a.detach(), self.b.detach()]).to("cpu", torch.float64)
        rhs[rows:] *= rhs[:rows].sum() / rhs[rows:].sum()
        bases = torch.tensor(list(itertools.combinations(range(cells), r)))
        As = A[:, bases].permute(1, 0, 2)                                  # (S, n + m, r)
        full = torch.linalg.matrix_rank(As) == r
        x = torch.linalg.lstsq(As[full], rhs.expand(int(full.sum()), -1).unsqueeze(-1)
                               ).solution.squeeze(-1)                     # (S', r)
        tol = 1e-9 * float(rhs[:rows].sum())
        keep = (x >= -tol).all(-1)
        plans = torch.zeros(int(keep.sum()), cells, dtype=torch.float64)
        plans.scatter_(1, bases[full][keep], x[keep].clamp_min(0))
        plans = torch.where(plans > tol, plans, 0.0)
        key = torch.round(plans / tol)
        _, first = np.unique(key.numpy(), axis=0, return_index=True)
        verts = plans[torch.from_numpy(np.sort(first))].reshape(-1, rows, m)
        return verts.to(device=device, dtype=dtype or torch.get_default_dtype())

    def cost(self, cost: torch.Tensor, tau: float | torch.Tensor = 1.0,
             backward: str = "auto") -> torch.Tensor:
        r"""The transport cost ⟨C, P_τ⟩ of the entropic plan P_τ = argmin_{P ∈ U(a,b)} ⟨C, P⟩ −
        τ H(P): POT's ``ot.sinkhorn2(a, b, M=C, reg=tau)`` (the cost without the entropy term).

        Differentiable in C (and a tensor τ, and with ``backward="implicit"`` in a, b): the
        gradient is that of the returned value, P_τ + ⟨C, ∂P_τ/∂C⟩ through the plan's backward.
        POT's ``sinkhorn2`` instead returns the plan P_τ as the gradient with respect to M (the
        envelope-theorem gradient of the regularized value ⟨C, P⟩ − τH(P)); use
        ``regularized_argmax(-C, self, tau=tau).detach()`` for that one. As τ → 0 both tend to
        the optimal plan, and the value to the exact transport cost (``ot.emd2``).

        Args:
            cost: the cost matrix C (``-w`` in the scores' convention of this structure).
            tau: the entropic temperature (POT's ``reg``).
            backward: as :func:`sinkhorn` (``"implicit"``, ``"unroll"``,
                ``"finite_difference"``; ``"auto"`` = implicit).

        Shape: ``cost`` ``(*batch, n, m)`` -> ``(*batch)``.

        Example::

            >>> a = torch.tensor([0.5, 0.5], dtype=torch.float64)
            >>> b = torch.tensor([0.25, 0.75], dtype=torch.float64)
            >>> C = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
            >>> Transport(a, b).cost(C, tau=1e-3)          # the exact cost: move 0.25
            tensor(0.2500, dtype=torch.float64)
        """
        from perturb.core import regularized_argmax   # (import cycle: core imports structures)
        plan = regularized_argmax(-cost, self, Entropy(), tau, backward)
        return (cost * plan).sum((-2, -1))

    def default_regularizer(self) -> Regularizer:
        return Entropy()

    def __repr__(self) -> str:
        n, m = self.sizes
        args = [f"a=<{tuple(self.a.shape)}>", f"b=<{tuple(self.b.shape)}>"]
        if self.n_iters != 1000:
            args.append(f"n_iters={self.n_iters}")
        if self.tol != 1e-6:
            args.append(f"tol={self.tol}")
        return f"Transport({', '.join(args)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        return (self.n_iters == other.n_iters and self.tol == other.tol
                and self.a.shape == other.a.shape and self.b.shape == other.b.shape
                and bool(torch.equal(self.a.detach(), other.a.detach().to(self.a.device)))
                and bool(torch.equal(self.b.detach(), other.b.detach().to(self.b.device))))

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.a.shape), tuple(self.b.shape), self.n_iters,
                     self.tol))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

@register_solver(Transport, Entropy, backward=SINKHORN_BACKWARD,
                 description="Sinkhorn with marginals a, b (log domain), temperature tau")
def _solve_transport_entropy(w, structure, regularizer, tau, backward):
    mask = structure._mask
    return sinkhorn(w, tau=tau, n_iters=structure.n_iters, tol=structure.tol, backward=backward,
                    a=structure.a.to(w.device), b=structure.b.to(w.device),
                    mask=None if mask is None else mask.to(w.device))


register_unsupported(
    Transport, SquaredNorm,
    reason="the Euclidean projection onto the transport polytope U(a, b) is a quadratic program "
           "with no closed form (unlike the simplex and the capped simplex) and is not "
           "implemented; use Entropy() (Sinkhorn with marginals a, b) instead")

register_unsupported(
    Transport, ExpFamilyEntropy,
    reason="the marginals of the Gibbs distribution over the vertices of U(a, b) include matrix "
           "permanents (a = b = 1 gives the permutations), which are #P-hard to compute; use "
           "Entropy() (Sinkhorn with marginals a, b) instead")
