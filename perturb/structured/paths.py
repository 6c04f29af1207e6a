r"""Source-to-sink paths in the complete DAG: :class:`DAGPaths`, its exact argmax (the longest
path), the log-partition and the Gibbs marginals (the registered relaxation).

This module is also the worked example of adding a structure (docs/adding_a_structure.md): one
file holds the structure, its engine, one thin public function and the solver registration.

**The set.** Nodes 0, 1, …, n − 1 with an edge i → j for every i < j (0, 1, …, n − 1 is a
topological order); a path 0 = v_0 < v_1 < … < v_m = n − 1 from the source 0 to the sink n − 1
is the 0/1 matrix z with z_ij = 1 iff i → j is on it. A path is a choice of interior nodes, so
|Z| = 2^(n−2) (n ≥ 2). Scores ``w`` of shape ``(*batch, n, n)``: ``w[..., i, j]`` scores i → j
for i < j; the entries with i ≥ j are not edges: they are ignored, their output is 0 and their
gradient 0.

**Argmax** (longest path, max-plus DP in topological order): V_0 = 0,
V_j = max_{i<j} (V_i + w_ij), then backtrack from the sink along the best predecessors. Ties go
to the lowest-indexed predecessor at every step of the backtracking. O(n²) per graph, a Python
loop over the n nodes (the DP's sequence), vectorised over the batch.

**Gibbs distribution** q(z) ∝ exp(⟨w, z⟩/τ). With s = w/τ the backward DP
β_{n−1} = 0, β_i = logsumexp_{j>i} (s_ij + β_j) gives the log-partition A(s) = β_0 (β_i is the
log-partition of the paths from i to the sink). The marginals μ = ∇A(s) = E_q[z] are the
regularized argmax with f = A* (:class:`~perturb.regularizers.ExpFamilyEntropy`). Rather than
differentiating β_0 (whose logsumexp backward rounds at the scale of |β|: s is 1e7 per edge at
scores 1e4 and τ = 1e-3, so float32 splits exact ties wrongly), they are computed in probability
space: q is a Markov chain from the
source with steps P_ij = exp(s_ij + β_j − β_i) = softmax_{j>i}(s_ij + β_j), the visit
probabilities π solve π = e_0 + π P (a unit triangular system: forward substitution over
non-negative terms), and μ_ij = π_i P_ij. Rows of P sum to 1 and flow is conserved to rounding
at any score scale. The backward is autograd through these steps (``backward="unroll"``):
the Jacobian is ∇²A = Cov_q(z).

Half-precision scores are computed in float32 (:mod:`perturb._precision`).
"""
from __future__ import annotations

import torch

from perturb._precision import full_precision, working_dtype
from perturb._validation import check_scores, check_tau, scale_by_tau
from perturb.regularizers import ExpFamilyEntropy, Regularizer
from perturb.structures import Structure, register_solver

__all__ = ["DAGPaths", "dag_path_log_partition"]

_MAX_ENUMERATE = 16      # 2^14 paths of 16 x 16


# --------------------------------------------------------------------------------------------
# the engine: checked tensors (*batch, n, n), n >= 2
# --------------------------------------------------------------------------------------------

def _longest_path(w: torch.Tensor) -> torch.Tensor:
    """The longest source-to-sink path of each graph as a 0/1 matrix (module docstring)."""
    n = w.shape[-1]
    W = w.reshape(-1, n, n).to(working_dtype(w.dtype))
    B = W.shape[0]
    best = W.new_zeros(B, 1)                        # V_0 … V_{j−1}: the longest paths 0 -> i
    parents = [torch.zeros(B, 1, dtype=torch.long, device=w.device)]
    for j in range(1, n):
        # max returns the first (lowest) index among equal maxima
        v, p = (best + W[:, :j, j]).max(dim=-1, keepdim=True)
        best = torch.cat([best, v], dim=-1)
        parents.append(p)
    parent = torch.cat(parents, dim=-1)             # (B, n), parent[0] = 0
    on = torch.zeros(B, n, dtype=torch.bool, device=w.device)
    on[:, -1] = True
    node = torch.full((B, 1), n - 1, dtype=torch.long, device=w.device)
    for _ in range(n - 2):                          # the interior nodes; no host sync
        node = parent.gather(-1, node)
        on.scatter_(-1, node, True)
    on[:, 0] = False                                # the source has no incoming edge
    z = torch.zeros(B, n, n, dtype=w.dtype, device=w.device)
    # every node j on the path (but the source) takes the edge parent[j] -> j
    z.scatter_(-2, parent.unsqueeze(-2), on.unsqueeze(-2).to(z.dtype))
    return z.reshape(w.shape)


def _to_sink(s: torch.Tensor) -> torch.Tensor:
    """β of the module docstring, ``(*batch, n)``: β_i = log Σ exp(score) over paths i -> n − 1."""
    n = s.shape[-1]
    beta = s.new_zeros(*s.shape[:-2], 1)            # β_{n−1} = 0
    for i in range(n - 2, -1, -1):
        b = torch.logsumexp(s[..., i, i + 1:] + beta, dim=-1, keepdim=True)
        beta = torch.cat([b, beta], dim=-1)
    return beta


def _log_partition(s: torch.Tensor) -> torch.Tensor:
    """A(s) = log Σ_z exp⟨s, z⟩, ``(*batch)``."""
    return _to_sink(s)[..., 0]


def _marginals(s: torch.Tensor) -> torch.Tensor:
    """μ = E_q[z] = ∇A(s) by the Markov chain of the module docstring, ``(*batch, n, n)``."""
    n = s.shape[-1]
    beta = _to_sink(s)
    after = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
    logits = (s + beta.unsqueeze(-2)).masked_fill(~after, -torch.inf)
    # the sink has no successor: its row of P is 0 (a softmax over nothing would be NaN)
    step = torch.softmax(logits[..., :-1, :], dim=-1)
    step = torch.cat([step, torch.zeros_like(step[..., :1, :])], dim=-2)
    source = torch.zeros_like(beta).unsqueeze(-2)
    source[..., 0, 0] = 1
    # π (I − P) = e_0: the diagonal is taken as 1, only the strict upper part of −P is read
    visits = torch.linalg.solve_triangular(-step, source, upper=True, left=False,
                                           unitriangular=True)
    return visits.mT * step


# --------------------------------------------------------------------------------------------
# the structure
# --------------------------------------------------------------------------------------------

def _check_nodes(n: int, name: str) -> None:
    if n < 2:
        raise ValueError(f"{name} must hold a graph of n >= 2 nodes (the source 0 and the sink "
                         f"n − 1), got n = {n}")


class DAGPaths(Structure):
    r"""Paths from the source 0 to the sink n − 1 in the complete DAG on n nodes (edges i → j
    for i < j), as 0/1 edge matrices; 2^(n−2) of them (module docstring).

    ``argmax`` is the longest path (max-plus DP, ties to the lowest-indexed predecessor); the
    default regularizer :class:`~perturb.regularizers.ExpFamilyEntropy` gives the edge marginals
    of q(z) ∝ exp(⟨w, z⟩/τ) (backward ``"unroll"``, or ``"finite_difference"``).

    Shape: scores ``(*batch, n, n)`` with n ≥ 2; only the strict upper triangle (i < j) is used;
    vertices and marginals ``(*batch, n, n)``, zero on and below the diagonal. dtype and device
    follow the scores (half precision computed in float32).

    Example::

        >>> w = torch.tensor([[0., 1., 5.], [0., 0., 1.], [0., 0., 0.]])
        >>> DAGPaths().argmax(w)                     # 0 -> 2 (5) beats 0 -> 1 -> 2 (2)
        tensor([[0., 0., 1.],
                [0., 0., 0.],
                [0., 0., 0.]])
        >>> from perturb import regularized_argmax
        >>> mu = regularized_argmax(w, DAGPaths(), tau=1.0)   # P(0 -> 2) = e^5 / (e^5 + e^2)
        >>> round(mu[0, 2].item(), 4)
        0.9526
    """

    event_dim = 2
    square = True

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        check_scores(w, name, min_ndim=2, square=True)
        _check_nodes(w.shape[-1], name)

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return _longest_path(w)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        """0/1, zero on and below the diagonal, one edge out of the source, one into the sink,
        and in-degree = out-degree ≤ 1 at every other node (in a DAG that leaves one path)."""
        n = y.shape[-1]
        binary = ((y == 0) | (y == 1)).all(-1).all(-1)
        upper = (y.tril() == 0).all(-1).all(-1)
        into, out = y.sum(-2), y.sum(-1)
        ends = (out[..., 0] == 1) & (into[..., -1] == 1)
        inner = ((into == out) & (out <= 1))[..., 1:-1].all(-1)
        return binary & upper & ends & inner & (n >= 2)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All 2^(n−2) paths, ``(2^(n−2), n, n)``, interior node sets in binary counting order;
        2 ≤ n ≤ 16."""
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= _MAX_ENUMERATE:
            raise ValueError(f"n must be an int in [2, {_MAX_ENUMERATE}] for enumeration "
                             f"(2^(n−2) paths), got {n!r}")
        codes = torch.arange(2 ** (n - 2), device=device).unsqueeze(-1)
        inner = (codes >> torch.arange(n - 2, device=device)) & 1
        ends = torch.ones_like(codes)
        on = torch.cat([ends, inner, ends], dim=-1).bool()            # (N, n) nodes on the path
        count = on.long().cumsum(-1)                                   # on-nodes in [0, j]
        # i -> j is an edge of the path iff i < j are both on it with none on it in between
        between = count.unsqueeze(-2) - count.unsqueeze(-1) - on.long().unsqueeze(-2)
        after = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
        z = on.unsqueeze(-1) & on.unsqueeze(-2) & after & (between == 0)
        return z.to(dtype or torch.get_default_dtype())

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()


# --------------------------------------------------------------------------------------------
# the public function and the registered relaxation
# --------------------------------------------------------------------------------------------

@full_precision
def dag_path_log_partition(w: torch.Tensor, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""log Z = log Σ_z exp(⟨w, z⟩/τ) over the source-to-sink paths z of :class:`DAGPaths`.

    The backward DP β_i = logsumexp_{j>i}(w_ij/τ + β_j), log Z = β_0 (module docstring);
    O(n²) per graph. Differentiable by autograd: ∂ log Z/∂w = μ/τ with μ the edge marginals
    (``perturb.regularized_argmax(w, DAGPaths(), tau=tau)``).

    Args:
        w: edge scores; only the strict upper triangle (i < j) is used.
        tau: temperature τ > 0 (float or tensor broadcastable to ``(*batch)``).

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch)``, n ≥ 2.

    Returns:
        log Z in the dtype of ``w`` (half precision computed in float32).

    Raises:
        ValueError: non-square or n < 2 scores, NaN/inf scores, τ ≤ 0.

    Example::

        >>> dag_path_log_partition(torch.zeros(5, 5))     # 2^(5−2) paths of score 0
        tensor(2.0794)
    """
    DAGPaths().validate(w)
    check_tau(tau)
    return _log_partition(scale_by_tau(w, tau, 2))


@register_solver(DAGPaths, ExpFamilyEntropy, backward=("unroll",),
                 description="DAG path marginals (log-sum-exp DP, Markov chain)")
def _solve_paths(w, structure, regularizer, tau, backward):
    # w was checked by DAGPaths.validate and tau by the core: call the engine directly
    return _marginals(scale_by_tau(w, tau, 2))
