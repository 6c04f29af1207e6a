"""Input handling of the tree solvers: score/mask/length checks, the allowed-edge and node
masks, connectivity from the root, and the scaled scores every tree function starts from.

Shared by the linear-algebra solvers (:mod:`.matrix_tree`), the combinatorial ones
(:mod:`.structures`) and the samplers (:mod:`.sampling`), so that none of them takes
its input handling from another.
"""
from __future__ import annotations

import torch

from perturb import _validation
from perturb._validation import broadcasts_to, check_int, check_scores, scale_by_tau

__all__: list[str] = []


def _node_mask(w: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor | None:
    """Boolean ``(*batch, n)``: node k exists when k < lengths; None when every node exists."""
    if lengths is None:
        return None
    n = w.shape[-1]
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer tensor of shape {tuple(w.shape[:-2])}, "
                         f"got dtype {lengths.dtype}")
    lengths = lengths.to(w.device)
    try:
        shape = torch.broadcast_shapes(lengths.shape, w.shape[:-2])
    except RuntimeError:
        shape = None
    if shape != w.shape[:-2]:
        raise ValueError(f"lengths must broadcast to the batch shape {tuple(w.shape[:-2])}, "
                         f"got shape {tuple(lengths.shape)}")
    if not _validation.traced(lengths) and bool(
            ((lengths < 2) | (lengths > n)).any()):
        raise ValueError(f"lengths must lie in [2, n={n}], got values in "
                         f"[{int(lengths.min())}, {int(lengths.max())}]")
    return torch.arange(n, device=w.device) < lengths.unsqueeze(-1)


def _check_tree_scores(w: torch.Tensor, mask: torch.Tensor | None, name: str = "w") -> None:
    check_scores(w, name, min_ndim=2, square=True, allow_neg_inf=True)
    if w.shape[-1] < 2:
        raise ValueError(f"{name} must describe a graph with n >= 2 nodes, got shape "
                         f"{tuple(w.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = type(mask).__name__ + (f" of dtype {mask.dtype}"
                                         if isinstance(mask, torch.Tensor) else "")
            raise ValueError(f"mask must be a boolean tensor broadcastable to {tuple(w.shape)}, "
                             f"got {got}")
        if not broadcasts_to(mask.shape, w.shape):
            raise ValueError(f"mask of shape {tuple(mask.shape)} must broadcast to the scores' "
                             f"shape {tuple(w.shape)}")


def _edge_mask(w: torch.Tensor, mask: torch.Tensor | None, nodes: torch.Tensor | None,
               root: int | None, symmetric: bool) -> torch.Tensor:
    """Allowed edges ``(*batch, n, n)``: finite score, mask, no loop, no edge into the root,
    both ends existing; for undirected graphs an edge needs both directions allowed."""
    n = w.shape[-1]
    valid = w > -torch.inf
    if mask is not None:
        valid = valid & mask.to(w.device)
    valid = valid & ~torch.eye(n, dtype=torch.bool, device=w.device)
    if symmetric:
        valid = valid & valid.transpose(-1, -2)
    if nodes is not None:
        valid = valid & nodes.unsqueeze(-1) & nodes.unsqueeze(-2)
    if root is not None:
        valid[..., :, root] = False
    return valid.expand(w.shape)


def _reachable(valid: torch.Tensor, root: int) -> torch.Tensor:
    """Nodes reachable from ``root`` along allowed edges, ``(*batch, n)``; BFS by matrix–vector
    products (at most n sweeps, stops when nothing changes)."""
    adj = valid.to(torch.float32)
    reach = torch.zeros(valid.shape[:-1], dtype=torch.bool, device=valid.device)
    reach[..., root] = True
    for _ in range(valid.shape[-1]):
        new = reach | ((reach.to(adj.dtype).unsqueeze(-2) @ adj).squeeze(-2) > 0)
        if bool((new == reach).all()):
            break
        reach = new
    return reach


def _check_connected(valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
                     directed: bool) -> None:
    """ValueError when some existing node cannot be reached from ``root``."""
    if not _validation.validation_enabled():
        return
    reach = _reachable(valid, root)
    need = nodes if nodes is not None else torch.ones_like(reach)
    missing = need & ~reach
    if bool(missing.any()):
        idx = missing.nonzero()[0].tolist()
        where = f"batch index {tuple(idx[:-1])}, " if len(idx) > 1 else ""
        if directed:
            raise ValueError(f"no arborescence rooted at {root} exists: node {idx[-1]} "
                             f"({where}first unreachable) cannot be reached from the root along "
                             "allowed edges (finite scores, True in mask)")
        raise ValueError(f"the graph is disconnected: node {idx[-1]} ({where}first one) is not "
                         "connected to node 0 along allowed edges (finite scores, True in mask)")


def _detached(w: torch.Tensor, name: str = "w") -> torch.Tensor:
    """``w.detach()`` after checking that ``w`` is a tensor (samplers and exact solvers)."""
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (*batch, n, n), got "
                         f"{type(w).__name__}")
    return w.detach()


def _check_args(w, tau, mask, lengths, root, symmetric, name="w"):
    """The argument checks of every public tree function: scores, mask, τ, root and lengths.
    Returns (root, nodes): the root as an int (0 for undirected problems) and the node mask
    ``(*batch, n)`` of ``lengths`` (None without)."""
    _check_tree_scores(w, mask, name)
    _validation.check_tau(tau)
    n = w.shape[-1]
    # undirected problems are rooted at node 0 internally; a directed root is a node index in
    # [0, n − 1] (no Python-style wrap-around, no None)
    root = 0 if symmetric else check_int(root, "root", low=0, high=n - 1)
    nodes = _node_mask(w, lengths)
    if (not _validation.traced(w) and nodes is not None and root != 0
            and bool((~nodes[..., root]).any())):
        raise ValueError(f"root={root} lies beyond the graph size given by lengths")
    return root, nodes


def _graph_scores(w, tau, mask, nodes, root, symmetric):
    """(scores s = w/τ with masked entries zero-filled, allowed edges, node mask, root) for
    checked arguments (:func:`_check_args`, or a structure's ``validate`` and the core's τ
    check for the registered solvers). Raises ValueError when some node cannot be reached
    from the root (a value check: only while validation is enabled). Masked entries are
    filled before dividing by τ so that a gradient with respect to τ never meets −inf·0."""
    n = w.shape[-1]
    # no host reads inside torch.compile / torch.func: the general path below
    traced = _validation.traced(w)
    if mask is None and nodes is None and (traced or bool(torch.isfinite(w.detach().sum()))):
        # common case: complete graph, no -inf (a finite sum rules out ±inf and NaN). The
        # allowed edges are the same for every batch element: an (n, n) pattern broadcast over
        # the batch (a view), the graph is connected (the root reaches every node directly),
        # and nothing needs zero-filling (every forbidden entry is finite and gets weight
        # exactly 0 below, so its gradient is exactly 0 too).
        valid = ~torch.eye(n, dtype=torch.bool, device=w.device)
        dvalid = valid.clone()
        dvalid[:, root] = False
        if not symmetric:
            valid = dvalid
        w_f = 0.5 * (w + w.transpose(-1, -2)) if symmetric else w
        return scale_by_tau(w_f, tau, 2), dvalid.expand(w.shape), None, root
    valid = _edge_mask(w, mask, nodes, root if not symmetric else None, symmetric)
    if symmetric:
        dvalid = valid.clone()
        dvalid[..., :, root] = False
    else:
        dvalid = valid
    if not traced and (not bool(valid.all()) or nodes is not None):
        # a value check: skipped inside torch.compile / torch.func like the others
        _check_connected(dvalid, nodes, root, directed=not symmetric)
    w_f = w.masked_fill(~valid, 0.0)
    if symmetric:
        w_f = 0.5 * (w_f + w_f.transpose(-1, -2))
    s = scale_by_tau(w_f, tau, 2)
    return s, dvalid, nodes, root


def _prepare(w, tau, mask, lengths, root, symmetric, name="w"):
    """Validate (:func:`_check_args`) and return :func:`_graph_scores`."""
    root, nodes = _check_args(w, tau, mask, lengths, root, symmetric, name)
    return _graph_scores(w, tau, mask, nodes, root, symmetric)
