"""Dynamic graph reconstruction: recover a latent tree from the trajectory of a graph layout.

The experiment of Paulus et al. (2020, "Gradient estimation with stochastic softmax tricks",
arXiv:2006.08063, §6.2), after NRI (Kipf et al. 2018). Data: per example a random tree on n
vertices, the maximum spanning tree of i.i.d. Gumbel(0, 1) edge weights; initial positions
x_0 ~ N(0, I) in 2-D; then T steps of the Fruchterman–Reingold force-directed layout
(:func:`force_directed_layout`, the networkx ``spring_layout`` update vectorised in torch). The
observation is the trajectory x_0..x_T; the tree is hidden.

Model (:class:`GraphLayoutVAE`): a GNN encoder maps the trajectory to scores θ_e for the
E = n(n−1)/2 undirected pairs; a latent graph X is a stochastic softmax of θ,

    U = θ + G  (G_e i.i.d. Gumbel(0, 1)),      X_τ = argmax_{x ∈ conv Z} ⟨U, x⟩ − τ f(x),

for Z = spanning trees (f = A*, X_τ = matrix-tree marginals of U/τ), Z = (n−1)-subsets of the
pairs (f = A*, the k-subset marginals), or Z = {0, 1}^E ("independent edges": each edge is a
two-way softmax of the utilities (θ_e + G_e, G'_e), i.e. a binary Concrete); a decoder predicts
x_{t+1} from x_t by message passing over X_τ with a Gaussian likelihood N(x_{t+1}; μ_t, σ² I).

The ELBO uses the KL divergence of the perturbed utilities U against the prior U ~ Gumbel(0, 1)
(prior: θ = 0). X_τ is a deterministic function of U, so by the data-processing inequality
KL(q(X_τ) ‖ p(X_τ)) ≤ KL(q(U) ‖ p(U)), and

    ELBO(x) = E_G[log p(x_1..x_T | x_0, X_τ)] − KL(q(U | x) ‖ p(U)) ≤ log p(x_1..x_T | x_0)

is a lower bound of the relaxed model's likelihood, the same estimator for the three graphs.
Under the prior the exact tree (τ → 0) is the maximum spanning tree of i.i.d. Gumbel weights:
the data's own tree distribution. Each X is invariant to a common shift of the utilities of one
structure (all trees have n − 1 edges; a two-way softmax is shift invariant), so the bound is
tightened by the best shift c, in closed form (:func:`gumbel_kl`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from perturb._validation import check_choice, check_int, check_real, check_scores
from perturb.noise import Gumbel
from perturb.regularizers import Entropy, ExpFamilyEntropy
from perturb.core import perturb, regularized_argmax
from perturb.structured.subsets import KSubset, topk
from perturb.structured.trees import SpanningTrees, max_spanning_tree
from perturb.structures import Simplex

__all__ = ["random_trees", "force_directed_layout", "make_graph_layout", "GraphLayoutData",
           "gumbel_kl", "edge_precision_recall", "GraphLayoutVAE", "GraphELBO"]

LATENT_GRAPHS = ("tree", "independent", "topk")


def _pairs(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column indices of the upper triangle (i < j), in row-major order."""
    rows, cols = torch.triu_indices(n, n, 1, device=device).unbind(0)
    return rows, cols


def _to_matrix(values: torch.Tensor, n: int) -> torch.Tensor:
    """``(*batch, E)`` pair values -> symmetric ``(*batch, n, n)`` matrix, zero diagonal."""
    i, j = _pairs(n, values.device)
    out = values.new_zeros(*values.shape[:-1], n, n)
    out[..., i, j] = values
    return out + out.transpose(-1, -2)


def _to_pairs(matrix: torch.Tensor) -> torch.Tensor:
    """``(*batch, n, n)`` -> its upper triangle ``(*batch, E)``."""
    i, j = _pairs(matrix.shape[-1], matrix.device)
    return matrix[..., i, j]


def random_trees(n_trees: int, n_nodes: int = 10,
                 generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random trees: maximum spanning trees of i.i.d. Gumbel(0, 1) edge weights (Kruskal's
    tree of random weights, as in the paper's code; not the uniform distribution on trees).

    Shape: -> ``(n_trees, n_nodes, n_nodes)`` 0/1 adjacency, symmetric, n − 1 edges.
    """
    check_int(n_trees, "n_trees", low=0)
    check_int(n_nodes, "n_nodes", low=2)
    E = n_nodes * (n_nodes - 1) // 2
    w = perturb(torch.zeros(n_trees, E, dtype=dtype), Gumbel(), generator=generator)
    return max_spanning_tree(_to_matrix(w, n_nodes))


def force_directed_layout(adjacency: torch.Tensor, pos: torch.Tensor, n_steps: int,
                          k: float | None = None) -> torch.Tensor:
    """The trajectory of ``n_steps`` Fruchterman–Reingold steps (networkx's dense
    ``_fruchterman_reingold`` with ``iterations=n_steps``, no early stop, no rescaling),
    vectorised over the batch; deterministic.

    With δ_ij = x_i − x_j, d_ij = max(‖δ_ij‖, 0.01) and k = √(1/n) (the optimal distance),

        D_i = Σ_j δ_ij (k²/d_ij² − A_ij d_ij / k),   x_i ← x_i + t_s D_i / max(‖D_i‖, 0.01),

    with the temperature t_s = t_0 − s·t_0/(T+1), t_0 = 0.1 · (largest side of the bounding box
    of x_0): every vertex moves by t_s along its net force (repulsion between all pairs,
    attraction along edges).

    Args:
        adjacency: symmetric 0/1 (or weighted) adjacency A.
        pos: initial positions x_0.
        n_steps: T ≥ 1.
        k: optimal distance (default √(1/n)).

    Shape: ``adjacency`` ``(*batch, n, n)``, ``pos`` ``(*batch, n, 2)`` -> trajectory
    ``(*batch, T + 1, n, 2)`` (x_0 first); dtype and device of ``pos``.
    """
    check_int(n_steps, "n_steps", low=1)
    check_scores(pos, "pos", min_ndim=2)
    check_scores(adjacency, "adjacency", min_ndim=2, square=True)
    n = pos.shape[-2]
    if adjacency.shape[-2:] != (n, n):
        raise ValueError(f"adjacency must have shape (*batch, {n}, {n}) to match pos "
                         f"{tuple(pos.shape)}, got {tuple(adjacency.shape)}")
    if k is None:
        k = math.sqrt(1.0 / n)
    k = check_real(k, "k", low=1e-12)
    A = adjacency.to(pos.dtype)
    t = 0.1 * (pos.amax(-2) - pos.amin(-2)).amax(-1)           # (*batch,)
    dt = t / (n_steps + 1)
    traj = [pos]
    x = pos
    for _ in range(n_steps):
        delta = x.unsqueeze(-2) - x.unsqueeze(-3)                 # (*batch, n, n, 2)
        dist = delta.norm(dim=-1).clamp_min(0.01)
        disp = (delta * (k * k / dist ** 2 - A * dist / k).unsqueeze(-1)).sum(-2)
        length = disp.norm(dim=-1).clamp_min(0.01)
        x = x + disp * (t[..., None] / length).unsqueeze(-1)
        t = t - dt
        traj.append(x)
    return torch.stack(traj, dim=-3)


class GraphLayoutData(NamedTuple):
    """Trajectories ``(N, T + 1, n, 2)`` and the true trees ``(N, n, n)``."""
    trajectories: torch.Tensor
    adjacency: torch.Tensor


def make_graph_layout(n_examples: int, n_nodes: int = 10, n_steps: int = 10,
                      generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float32) -> GraphLayoutData:
    """The data set: a :func:`random_trees` tree, x_0 ~ N(0, I_2) per vertex, then
    :func:`force_directed_layout` for ``n_steps`` steps.

    Shape: -> trajectories ``(n_examples, n_steps + 1, n_nodes, 2)``, adjacency
    ``(n_examples, n_nodes, n_nodes)``.
    """
    A = random_trees(n_examples, n_nodes, generator=generator, dtype=dtype)
    pos = torch.randn(n_examples, n_nodes, 2, generator=generator, dtype=dtype)
    return GraphLayoutData(force_directed_layout(A, pos, n_steps), A)


def gumbel_kl(theta: torch.Tensor, shift_invariant: bool = True) -> torch.Tensor:
    """KL(Gumbel(θ, 1) ‖ Gumbel(0, 1)) summed over the last dim (independent coordinates).

    Per coordinate the KL is θ − 1 + e^{−θ}. If the structure is invariant to a common shift
    of the m utilities (``shift_invariant=True``), the smallest KL over the shift c,

        min_c Σ_i (θ_i − c) − 1 + e^{−(θ_i − c)} = Σ_i θ_i + m·logsumexp(−θ) − m·log m ≥ 0,

    (attained at c = log m − logsumexp(−θ)), is returned; it is zero iff all θ_i are equal.

    Shape: ``(*batch, m)`` -> ``(*batch)``.
    """
    check_scores(theta, "theta", min_ndim=1)
    if not shift_invariant:
        return (theta - 1 + torch.exp(-theta)).sum(-1)
    m = theta.shape[-1]
    return (theta.sum(-1) + m * torch.logsumexp(-theta, -1) - m * math.log(m)).clamp_min(0)


def edge_precision_recall(estimate: torch.Tensor, truth: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Precision and recall of the undirected edges (upper triangles, entries > 0.5) of
    ``estimate`` against ``truth``, per graph (an empty estimate has precision 0).

    Shape: ``(*batch, n, n)`` both -> two ``(*batch)`` tensors.
    """
    check_scores(estimate, "estimate", min_ndim=2, square=True)
    if estimate.shape != truth.shape:
        raise ValueError(f"truth must have the shape of estimate {tuple(estimate.shape)}, "
                         f"got {tuple(truth.shape)}")
    e, t = _to_pairs(estimate) > 0.5, _to_pairs(truth) > 0.5
    tp = (e & t).sum(-1).to(torch.float32)
    return tp / e.sum(-1).clamp_min(1), tp / t.sum(-1).clamp_min(1)


class GraphELBO(NamedTuple):
    """Per-example ``elbo = log_likelihood − kl``, each ``(B,)``."""
    elbo: torch.Tensor
    log_likelihood: torch.Tensor
    kl: torch.Tensor


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ELU(), nn.Linear(hidden, hidden), nn.ELU(),
                         nn.Linear(hidden, n_out))


class GraphLayoutVAE(nn.Module):
    """NRI-style VAE with a latent graph: encoder, stochastic softmax graph, GNN decoder.

    Encoder (symmetric in i, j): a node MLP on the centred trajectory of each vertex, an edge MLP
    on [h_i + h_j, h_i ⊙ h_j, d_ij(0..T)] (the pair's distances over time), a node MLP on the
    summed edge features, and a second edge MLP -> one score θ_ij per undirected pair.

    Latent graph (module docstring): ``latent="tree"`` (relaxed spanning trees, E.F. entropy),
    ``"topk"`` ((n−1)-subsets of pairs, E.F. entropy), ``"independent"`` (binary Concrete per
    pair). ``hard=True``: straight-through (the exact argmax of the same utilities forward).

    Decoder (equivariant message passing: translations exactly; rotations and reflections
    except through the bounding-box extent of x_0, as the layout itself): with δ_ij = x_i − x_j
    and invariant features φ_ij = (d_ij, 1/d_ij, log d_ij) of the current positions, the force
    on i is
    F_i = Σ_j δ_ij [a(φ_ij) + X_ij b(φ_ij)] (a: all pairs, b: the latent graph's edges; scalar
    MLPs), and the mean of the next positions is x_i + t_s F_i / max(‖F_i‖, 0.01) with the
    layout's known cooling schedule t_s (:func:`force_directed_layout`): the structure of the
    update (each vertex moves a known distance along a net pairwise force) is given, the force
    laws a, b and the graph are learnt. (With a learnt step length the decoder falls into the
    trap "step → 0" before it has learnt directions: the graph is then ignored and the
    posterior collapses to the prior.)

    Args:
        n_nodes: n.
        latent: one of ``"tree"``, ``"independent"``, ``"topk"``.
        hidden: MLP width.
        tau: temperature of the relaxation.
        hard: straight-through forward.
        obs_scale: σ of the Gaussian likelihood.
    """

    def __init__(self, n_nodes: int, latent: str = "tree", hidden: int = 64, tau: float = 0.5,
                 hard: bool = False, obs_scale: float = 0.02, n_steps: int = 10):
        super().__init__()
        self.n_nodes = check_int(n_nodes, "n_nodes", low=3)
        check_choice(latent, LATENT_GRAPHS, "latent")
        self.latent = latent
        self.n_steps = check_int(n_steps, "n_steps", low=1)
        self.tau = check_real(tau, "tau", low=1e-12)
        if not isinstance(hard, bool):
            raise ValueError(f"hard must be a bool, got {hard!r}")
        self.hard = hard
        self.obs_scale = check_real(obs_scale, "obs_scale", low=1e-12)
        hidden = check_int(hidden, "hidden", low=1)
        T1 = n_steps + 1
        self.node1 = _mlp(2 * T1, hidden, hidden)
        self.edge1 = _mlp(2 * hidden + T1, hidden, hidden)
        self.node2 = _mlp(hidden, hidden, hidden)
        self.edge2 = _mlp(3 * hidden, hidden, 1)
        self.force_all = _mlp(3, hidden, 1)
        self.force_edge = _mlp(3, hidden, 1)

    def _check_traj(self, traj: torch.Tensor) -> None:
        check_scores(traj, "traj", min_ndim=4)
        want = (self.n_steps + 1, self.n_nodes, 2)
        if traj.ndim != 4 or tuple(traj.shape[1:]) != want:
            raise ValueError(f"traj must have shape (B, {want[0]}, {want[1]}, 2), "
                             f"got {tuple(traj.shape)}")

    def _check_theta(self, theta: torch.Tensor) -> None:
        check_scores(theta, "theta", min_ndim=1)
        E = self.n_nodes * (self.n_nodes - 1) // 2
        if theta.shape[-1] != E:
            raise ValueError(f"theta must have shape (B, {E}) (one score per pair of the "
                             f"{self.n_nodes} vertices), got {tuple(theta.shape)}")

    # encoder -----------------------------------------------------------------------------------
    def edge_scores(self, traj: torch.Tensor) -> torch.Tensor:
        """Scores θ of the undirected pairs. Shape: ``(B, T + 1, n, 2)`` -> ``(B, E)``."""
        self._check_traj(traj)
        B, T1, n, _ = traj.shape
        x = traj - traj.mean(-2, keepdim=True)
        h = self.node1(x.permute(0, 2, 1, 3).reshape(B, n, 2 * T1))        # (B, n, H)
        i, j = _pairs(n, traj.device)
        dist = (traj[..., i, :] - traj[..., j, :]).norm(dim=-1).transpose(1, 2)  # (B, E, T1)
        hi, hj = h[:, i], h[:, j]
        e = self.edge1(torch.cat([hi + hj, hi * hj, dist], -1))              # (B, E, H)
        agg = torch.zeros_like(h).index_add_(1, i, e).index_add_(1, j, e)
        h2 = self.node2(agg / (n - 1))
        h2i, h2j = h2[:, i], h2[:, j]
        return self.edge2(torch.cat([h2i + h2j, h2i * h2j, e], -1)).squeeze(-1)

    # latent graph ------------------------------------------------------------------------------
    def sample_graph(self, theta: torch.Tensor, generator: torch.Generator | None = None
                     ) -> torch.Tensor:
        """A relaxed (or, with ``hard``, exact) graph from the perturbed scores.

        Shape: ``(B, E)`` -> symmetric ``(B, n, n)``.
        """
        self._check_theta(theta)
        n = self.n_nodes
        if self.latent == "independent":
            # utilities (θ_e + G_e, G'_e): a two-way softmax = binary Concrete σ((θ + L)/τ)
            U = perturb(torch.stack([theta, torch.zeros_like(theta)], -1), Gumbel(),
                        generator=generator)
            soft = regularized_argmax(U, Simplex(), Entropy(), self.tau)[..., 0]
            hard = (U[..., 0] > U[..., 1]).to(theta.dtype)
            return _to_matrix(self._straight_through(soft, hard), n)
        U = perturb(theta, Gumbel(), generator=generator)
        if self.latent == "tree":
            Um = _to_matrix(U, n)
            soft = regularized_argmax(Um, SpanningTrees(), ExpFamilyEntropy(), self.tau)
            return self._straight_through(soft, max_spanning_tree(Um) if self.hard else soft)
        soft = regularized_argmax(U, KSubset(n - 1), ExpFamilyEntropy(), self.tau)
        hard = topk(U, n - 1) if self.hard else soft
        return _to_matrix(self._straight_through(soft, hard), n)

    def _straight_through(self, soft: torch.Tensor, hard: torch.Tensor) -> torch.Tensor:
        return hard.detach() + soft - soft.detach() if self.hard else soft

    def mode(self, theta: torch.Tensor) -> torch.Tensor:
        """The posterior mode (noise-free argmax): the maximum spanning tree of θ, the top
        (n − 1) pairs, or the pairs with θ_e > 0 (P(edge) > 1/2).

        Shape: ``(B, E)`` -> ``(B, n, n)``.
        """
        self._check_theta(theta)
        n = self.n_nodes
        if self.latent == "tree":
            return max_spanning_tree(_to_matrix(theta.detach(), n))
        if self.latent == "topk":
            return _to_matrix(topk(theta.detach(), n - 1), n)
        return _to_matrix((theta.detach() > 0).to(theta.dtype), n)

    def kl(self, theta: torch.Tensor) -> torch.Tensor:
        """KL of the utilities against the Gumbel(0, 1) prior (module docstring).

        Shape: ``(B, E)`` -> ``(B,)``.
        """
        self._check_theta(theta)
        if self.latent == "independent":
            return gumbel_kl(torch.stack([theta, torch.zeros_like(theta)], -1)).sum(-1)
        return gumbel_kl(theta)

    # decoder -----------------------------------------------------------------------------------
    def decode(self, traj: torch.Tensor, graph: torch.Tensor) -> torch.Tensor:
        """Means of x_1..x_T given x_0..x_{T−1} (teacher forcing) and the graph.

        Shape: ``(B, T + 1, n, 2)``, ``(B, n, n)`` -> ``(B, T, n, 2)``.
        """
        x = traj[:, :-1]
        B, T, n, _ = x.shape
        delta = x.unsqueeze(-2) - x.unsqueeze(-3)                       # (B, T, n, n, 2)
        d = delta.norm(dim=-1).clamp_min(0.01)
        phi = torch.stack([d, 1 / d, d.log()], -1)
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        a = self.force_all(phi).squeeze(-1) * (1 - eye)
        b = self.force_edge(phi).squeeze(-1) * graph.unsqueeze(1)
        F = (delta * (a + b).unsqueeze(-1)).sum(-2)                      # (B, T, n, 2)
        extent = (traj[:, 0].amax(-2) - traj[:, 0].amin(-2)).amax(-1)   # (B,)
        # the layout's step lengths t_s = t_0 (1 − s/(T+1)), t_0 = 0.1·extent(x_0): known
        t = 0.1 * extent[:, None] * (1 - torch.arange(T, dtype=x.dtype, device=x.device)
                                     / (self.n_steps + 1))
        step = t[..., None, None] / F.norm(dim=-1, keepdim=True).clamp_min(0.01)
        return x + step * F

    def elbo(self, traj: torch.Tensor, generator: torch.Generator | None = None) -> GraphELBO:
        """One-sample relaxed ELBO per example (module docstring); x_0 is conditioned on.

        Shape: ``(B, T + 1, n, 2)`` -> three ``(B,)`` tensors.
        """
        theta = self.edge_scores(traj)
        graph = self.sample_graph(theta, generator)
        mean = self.decode(traj, graph)
        s = self.obs_scale
        ll = (-0.5 * ((traj[:, 1:] - mean) / s) ** 2
              - math.log(s) - 0.5 * math.log(2 * math.pi)).sum((1, 2, 3))
        kl = self.kl(theta)
        return GraphELBO(ll - kl, ll, kl)
