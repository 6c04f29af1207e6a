r"""The tree structures and their exact solvers: :class:`SpanningTrees`, :class:`Arborescences`,
maximum spanning tree (batched Prim in torch), maximum arborescence (Chu-Liu/Edmonds),
membership checks and enumeration for tiny n, and the registered relaxations (the matrix-tree
marginals of :mod:`perturb.structured.trees.matrix_tree`).

- :func:`max_spanning_tree`: argmax_T Σ_{{i,j}∈T} s_ij with s = (w + wᵀ)/2, by Prim's algorithm
  on dense matrices, vectorised over the batch: n − 1 steps of O(n) work per graph (O(n²) in
  all), no host synchronisation inside the loop, any device.
- :func:`max_arborescence`: argmax_T Σ_{(i→j)∈T} w_ij over arborescences rooted at ``root``, by
  Chu-Liu/Edmonds (greedy best parents, contract a cycle, recurse, expand; O(n³) worst case per
  graph). It runs in NumPy on the CPU, one graph at a time (a combinatorial solver with
  recursion on cycles; the result is moved back to the input's device and dtype).

References:
    Prim, "Shortest connection networks and some generalizations", 1957.
    Chu & Liu, 1965; Edmonds, "Optimum branchings", J. Res. NBS 71B, 1967.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from perturb._validation import check_int
from perturb.regularizers import ExpFamilyEntropy, Regularizer
from perturb.structured.trees._graph_input import (
    _check_tree_scores,
    _detached,
    _graph_scores,
    _prepare,
    _reachable,
)
from perturb.structured.trees._matrix_tree import MARGINAL_BACKWARDS, marginals
from perturb.structures import Structure, register_solver

__all__ = ["SpanningTrees", "Arborescences", "max_spanning_tree", "max_arborescence",
           "is_spanning_tree", "is_arborescence", "enumerate_spanning_trees",
           "enumerate_arborescences"]

_MAX_ENUMERATE = 8


# --------------------------------------------------------------------------------------------
# maximum spanning tree: batched Prim
# --------------------------------------------------------------------------------------------

def max_spanning_tree(w: torch.Tensor, mask: torch.Tensor | None = None,
                      lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""The maximum spanning tree argmax_T Σ_{{i,j}∈T} s_ij, s = (w + wᵀ)/2, as a 0/1 matrix.

    Batched Prim's algorithm on dense scores (module docstring): O(n²) per graph, vectorised over
    the batch; ties go to the lowest node index. Not differentiable (piecewise constant).

    Args:
        w: scores; only the symmetric part is used, the diagonal is ignored, ``-inf`` forbids an
            edge.
        mask: optional boolean adjacency broadcastable to ``w``.
        lengths: optional ``(*batch)`` graph sizes (nodes ``>= lengths`` are padding).

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)``, symmetric, zero diagonal, n − 1 edges.

    Returns:
        The tree's adjacency matrix, same dtype and device as ``w``.

    Raises:
        ValueError: non-square, n < 2, NaN, or a disconnected graph.

    Example::

        >>> w = torch.tensor([[0., 3., 1.], [3., 0., 2.], [1., 2., 0.]])
        >>> max_spanning_tree(w)
        tensor([[0., 1., 0.],
                [1., 0., 1.],
                [0., 1., 0.]])
    """
    s, valid, nodes, _ = _prepare(_detached(w), 1.0, mask, lengths, None, True)
    n = w.shape[-1]
    batch = w.shape[:-2]
    # undirected allowed edges (the directed mask from _prepare drops the edges into node 0)
    sym = valid | valid.transpose(-1, -2)
    S = s.masked_fill(~sym, -torch.inf).reshape(-1, n, n)
    B = S.shape[0]
    exists = (nodes.expand(*batch, n).reshape(B, n) if nodes is not None
              else torch.ones(B, n, dtype=torch.bool, device=w.device))
    in_tree = ~exists
    in_tree[:, 0] = True
    best = S[:, 0, :].clone()
    parent = torch.zeros(B, n, dtype=torch.long, device=w.device)
    ar = torch.arange(B, device=w.device)
    for _ in range(n - 1):
        active = ~in_tree.all(dim=-1)
        v = best.masked_fill(in_tree, -torch.inf).argmax(dim=-1)
        in_tree[ar, v] = in_tree[ar, v] | active
        row = S[ar, v]
        upd = (row > best) & ~in_tree & active.unsqueeze(-1)
        best = torch.where(upd, row, best)
        parent = torch.where(upd, v.unsqueeze(-1), parent)
    T = torch.zeros(B, n, n, dtype=w.dtype, device=w.device)
    child = exists.clone()
    child[:, 0] = False
    b_idx, v_idx = child.nonzero(as_tuple=True)
    T[b_idx, parent[b_idx, v_idx], v_idx] = 1
    T = T + T.transpose(-1, -2)
    return T.reshape(*batch, n, n)


# --------------------------------------------------------------------------------------------
# maximum arborescence: Chu-Liu/Edmonds (NumPy, one graph at a time)
# --------------------------------------------------------------------------------------------

def _find_cycle(parent: np.ndarray, root: int) -> list[int] | None:
    """A cycle of the parent graph (each non-root node points to its parent), or None."""
    n = len(parent)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current path, 2 done
    state[root] = 2
    for start in range(n):
        path, v = [], start
        while state[v] == 0:
            state[v] = 1
            path.append(v)
            v = parent[v]
            if v < 0:
                break
        if v >= 0 and state[v] == 1:
            return path[path.index(v):]
        for u in path:
            state[u] = 2
    return None


def _chu_liu_edmonds(S: np.ndarray, root: int) -> np.ndarray:
    """Parent array of the maximum arborescence rooted at ``root`` (``parent[root] = -1``).

    ``S[i, j]`` scores i → j; ``-inf`` forbids an edge. Assumes one exists (checked before).
    """
    n = S.shape[0]
    S = S.copy()
    np.fill_diagonal(S, -np.inf)
    S[:, root] = -np.inf
    parent = S.argmax(axis=0)
    parent[root] = -1
    cycle = _find_cycle(parent, root)
    if cycle is None:
        return parent
    cyc = np.array(cycle)
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[cyc] = True
    others = np.flatnonzero(~in_cycle)
    m = len(others)
    c = m  # index of the contracted node
    S2 = np.full((m + 1, m + 1), -np.inf)
    S2[:m, :m] = S[np.ix_(others, others)]
    # entering the cycle at v from u: replaces v's cycle edge, so the gain is relative to it
    enter = S[np.ix_(others, cyc)] - S[parent[cyc], cyc][None, :]
    enter_at = cyc[enter.argmax(axis=1)]
    S2[:m, c] = enter.max(axis=1)
    leave = S[np.ix_(cyc, others)]
    leave_from = cyc[leave.argmax(axis=0)]
    S2[c, :m] = leave.max(axis=0)
    new_root = int(np.flatnonzero(others == root)[0])
    p2 = _chu_liu_edmonds(S2, new_root)
    result = parent.copy()
    for i, x in enumerate(others):
        if p2[i] == c:
            result[x] = leave_from[i]
        elif p2[i] >= 0:
            result[x] = others[p2[i]]
    u = p2[c]
    result[enter_at[u]] = others[u]
    return result


def max_arborescence(w: torch.Tensor, root: int = 0, mask: torch.Tensor | None = None,
                     lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""The maximum arborescence argmax_T Σ_{(i→j)∈T} w_ij rooted at ``root``, as a 0/1 matrix.

    Chu-Liu/Edmonds in NumPy on the CPU, one graph at a time (an exact combinatorial solver; the
    result returns to ``w``'s device and dtype). O(n³) worst case per graph.

    Args:
        w: scores, ``w[..., i, j]`` for the edge i → j; the diagonal and the root's column are
            ignored; ``-inf`` forbids an edge.
        root: the root node, an int in [0, n − 1].
        mask: optional boolean adjacency broadcastable to ``w``.
        lengths: optional ``(*batch)`` graph sizes.

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)``: ``T[..., i, j] = 1`` iff parent(j) = i.

    Raises:
        ValueError: non-square, n < 2, NaN, bad root, or a node unreachable from the root.

    Example::

        >>> w = torch.tensor([[0., 1., 0.5], [0., 0., 5.], [0., 5., 0.]])
        >>> max_arborescence(w, root=0).nonzero().tolist()   # 0 → 1 → 2
        [[0, 1], [1, 2]]
    """
    s, valid, nodes, root = _prepare(_detached(w), 1.0, mask, lengths, root, False)
    n = w.shape[-1]
    batch = w.shape[:-2]
    S = s.masked_fill(~valid, -torch.inf).reshape(-1, n, n).to("cpu", torch.float64).numpy()
    sizes = (nodes.expand(*batch, n).reshape(-1, n).sum(-1).tolist() if nodes is not None
             else [n] * S.shape[0])
    T = np.zeros_like(S)
    for b in range(S.shape[0]):
        k = int(sizes[b])
        parent = _chu_liu_edmonds(S[b, :k, :k], root)
        child = np.flatnonzero(parent >= 0)
        T[b, parent[child], child] = 1.0
    return torch.from_numpy(T).to(device=w.device, dtype=w.dtype).reshape(*batch, n, n)


# --------------------------------------------------------------------------------------------
# membership and enumeration
# --------------------------------------------------------------------------------------------

def _is_binary(y: torch.Tensor) -> torch.Tensor:
    return ((y == 0) | (y == 1)).all(dim=-1).all(dim=-1)


def is_spanning_tree(y: torch.Tensor) -> torch.Tensor:
    """Whether each ``(n, n)`` matrix is the symmetric 0/1 adjacency of a spanning tree."""
    n = y.shape[-1]
    ok = _is_binary(y) & (y == y.transpose(-1, -2)).all(-1).all(-1)
    ok = ok & (torch.diagonal(y, dim1=-2, dim2=-1) == 0).all(-1)
    ok = ok & (y.sum((-1, -2)) == 2 * (n - 1))
    reach = _reachable(y > 0, 0).all(-1)
    return ok & reach


def is_arborescence(y: torch.Tensor, root: int) -> torch.Tensor:
    """Whether each ``(n, n)`` matrix is the 0/1 matrix of an arborescence rooted at ``root``."""
    n = y.shape[-1]
    ok = _is_binary(y) & (torch.diagonal(y, dim1=-2, dim2=-1) == 0).all(-1)
    col = y.sum(-2)
    want = torch.ones(n, dtype=y.dtype, device=y.device)
    want[root] = 0
    ok = ok & (col == want).all(-1)
    return ok & _reachable(y > 0, root).all(-1)


def _check_enumerate_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= _MAX_ENUMERATE:
        raise ValueError(f"n must be an int in [2, {_MAX_ENUMERATE}] for enumeration "
                         f"(the count grows like n^(n−2)), got {n!r}")


def enumerate_spanning_trees(n: int, *, dtype=None, device=None) -> torch.Tensor:
    """All n^(n−2) spanning trees of K_n (Cayley) from their Prüfer sequences, ``(N, n, n)``."""
    _check_enumerate_n(n)
    trees = []
    for seq in itertools.product(range(n), repeat=n - 2):
        degree = [1] * n
        for v in seq:
            degree[v] += 1
        T = np.zeros((n, n))
        for v in seq:
            leaf = min(i for i in range(n) if degree[i] == 1)
            T[leaf, v] = T[v, leaf] = 1
            degree[leaf] -= 1
            degree[v] -= 1
        u, v = [i for i in range(n) if degree[i] == 1]
        T[u, v] = T[v, u] = 1
        trees.append(T)
    return torch.tensor(np.stack(trees), dtype=dtype or torch.get_default_dtype(), device=device)


def enumerate_arborescences(n: int, root: int = 0, *, dtype=None, device=None) -> torch.Tensor:
    """All n^(n−2) arborescences of the complete digraph rooted at ``root`` (brute force over
    parent assignments), ``(N, n, n)``."""
    _check_enumerate_n(n)
    others = [j for j in range(n) if j != root]
    out = []
    for parents in itertools.product(range(n), repeat=n - 1):
        par = dict(zip(others, parents))
        if any(par[j] == j for j in others):
            continue
        acyclic = True
        for j in others:
            seen, v = set(), j
            while v != root and acyclic:
                if v in seen:
                    acyclic = False
                seen.add(v)
                v = par[v]
            if not acyclic:
                break
        if acyclic:
            T = np.zeros((n, n))
            for j in others:
                T[par[j], j] = 1
            out.append(T)
    return torch.tensor(np.stack(out), dtype=dtype or torch.get_default_dtype(), device=device)


# --------------------------------------------------------------------------------------------
# the structures
# --------------------------------------------------------------------------------------------

class SpanningTrees(Structure):
    r"""Spanning trees of the complete graph on n nodes, as symmetric 0/1 adjacency matrices.

    Shape: scores ``(*batch, n, n)`` (symmetric part used, ``-inf`` forbids an edge); vertices
    ``(*batch, n, n)`` symmetric with n − 1 edges. ``argmax`` is :func:`max_spanning_tree`; the
    default regularizer :class:`~perturb.regularizers.ExpFamilyEntropy` gives the edge marginals
    (:func:`spanning_tree_marginals`).

    Example::

        >>> from perturb import relax
        >>> theta = torch.randn(6, 6, requires_grad=True)
        >>> x = relax(theta, SpanningTrees(), tau=0.5)   # marginals of a perturbed tree
    """

    event_dim = 2
    square = True

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        _check_tree_scores(w, None, name)

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return max_spanning_tree(w)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        return is_spanning_tree(y)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All n^(n−2) trees (Cayley), ``(n^(n−2), n, n)``; n ≤ 8."""
        return enumerate_spanning_trees(n, dtype=dtype, device=device)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()


class Arborescences(Structure):
    r"""Arborescences (directed spanning trees) rooted at ``root``: ``T[i, j] = 1`` iff i → j.

    Shape: scores ``(*batch, n, n)`` (``w[..., i, j]`` scores i → j; the diagonal and the root's
    column are ignored); vertices ``(*batch, n, n)`` with one 1 in every non-root column.
    ``argmax`` is :func:`max_arborescence` (Chu-Liu/Edmonds); the default regularizer gives the
    edge marginals (:func:`arborescence_marginals`).

    Args:
        root: the root node, an int >= 0 (and < n for graphs of n nodes; no wrap-around).
    """

    event_dim = 2
    square = True

    def __init__(self, root: int = 0):
        self.root = check_int(root, "root", low=0)

    def _root(self, n: int) -> int:
        if not self.root < n:
            raise ValueError(f"root={self.root} is out of range for graphs with n={n} nodes")
        return self.root

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        _check_tree_scores(w, None, name)
        self._root(w.shape[-1])

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return max_arborescence(w, root=self.root)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        return is_arborescence(y, self._root(y.shape[-1]))

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All n^(n−2) arborescences rooted at ``root``, ``(n^(n−2), n, n)``; n ≤ 8."""
        if isinstance(n, int) and not isinstance(n, bool) and n >= 2:
            root = self._root(n)
        else:
            root = 0
        return enumerate_arborescences(n, root, dtype=dtype, device=device)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()

    def __repr__(self) -> str:
        return f"Arborescences(root={self.root})"


@register_solver(SpanningTrees, ExpFamilyEntropy, backward=MARGINAL_BACKWARDS,
                 description="Kirchhoff matrix-tree marginals")
def _solve_spanning_trees(w, structure, regularizer, tau, backward):
    # w was checked by SpanningTrees.validate and tau by the core: build the graph, call the
    # engine (spanning_tree_marginals would check both again)
    s, valid, nodes, root = _graph_scores(w, tau, None, None, 0, True)
    mu = marginals(s, valid, nodes, root, backward)
    return mu + mu.transpose(-1, -2)


@register_solver(Arborescences, ExpFamilyEntropy, backward=MARGINAL_BACKWARDS,
                 description="Tutte directed matrix-tree marginals")
def _solve_arborescences(w, structure, regularizer, tau, backward):
    # w and the root were checked by Arborescences.validate, tau by the core
    s, valid, nodes, root = _graph_scores(w, tau, None, None, structure.root, False)
    return marginals(s, valid, nodes, root, backward)
