r"""Unsupervised parsing of simplified ListOps through a latent arborescence (Paulus et al. 2020).

**Data.** An expression is a digit 0–9 or ``[OP a_1 … a_k ]`` with 2 ≤ k ≤ ``max_args``
arguments, OP one of

- MIN, MAX: the smallest / largest argument;
- MED: the lower median, the element at index ⌊(k − 1)/2⌋ of the sorted arguments;
- SM: the sum modulo 10.

The value (a digit, 10 classes) is computed exactly. Expressions are written in prefix order as
tokens: the ten digits, the four opening tokens ``[MIN [MAX [MED [SM`` and the closing bracket
``]`` (15 tokens; ``PAD`` = 15 pads a batch). The outermost node is always an operator, nesting
depth ≤ ``max_depth`` (depth 1 = one operator over digits) and length ≤ ``max_length`` tokens.

**Gold parse (the convention).** An arborescence over token positions rooted at position 0, the
outermost operator: ``T[i, j] = 1`` iff token i is the head (parent) of token j, where the head
of every argument (a digit or a nested operator) and of the closing bracket ``]`` of an
operator is that operator's opening token. Every non-root token has exactly one head, so a
sequence of length L has L − 1 gold arcs. Padding positions have no arcs in the gold parse; for
the arborescence solvers they hang off the root with a fixed score (one allowed arc, marginal 1)
and are dropped from the graph the GNN sees and from the metrics.

**Model** (:class:`LatentListOpsModel`). Token embeddings → BiLSTM → biaffine arc scores
``s[b, i, j]`` (head i → dependent j) → a latent graph ``X`` (``(B, n, n)``, weights in [0, 1]):

- ``"arborescence"``: ``X = relax(s, Arborescences(0), Gumbel(), tau)``, the Tutte edge
  marginals of the Gumbel-perturbed scores (a stochastic softmax trick; ``hard=True``: the exact
  maximum arborescence forward, straight-through backward); mode ``max_arborescence(s)``;
- ``"independent"``: every arc on its own, ``X_ij = σ((s_ij + ε_ij)/τ)``, ε ~ Logistic (the
  binary Concrete); mode ``1[s_ij > 0]``;
- ``"gold"``: the gold parse itself (an upper bound: the GNN with the true structure).

A GNN then runs ``n_rounds`` rounds of message passing from dependents to heads over ``X``,
``h_i ← GRU(Σ_j X_ij · m(h_j), h_i)`` starting from a second embedding of the tokens (so the
value can only reach the root through the graph; the encoder sees the sequence but only scores
arcs), and a classifier reads the root's state. Training: cross-entropy of the value; the graph
gets no supervision. Evaluation uses the mode graph.

Reference: Paulus, Choi, Tarlow, Krause & Maddison, "Gradient Estimation with Stochastic Softmax
Tricks", NeurIPS 2020, arXiv:2006.08063 (section 8.3); ListOps: Nangia & Bowman 2018.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from perturb._validation import check_choice, check_int, check_tau
from perturb.noise import Gumbel, Logistic, Noise
from perturb.core import relax
from perturb.structured.trees import Arborescences, max_arborescence

__all__ = ["ListOpsBatch", "make_listops", "gold_arborescence", "LatentListOpsModel",
           "arc_precision_recall", "LISTOPS_VOCAB"]

#: token strings by id; ids 0–9 are the digits, ``PAD`` (id 15) pads a batch
LISTOPS_VOCAB = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                 "[MIN", "[MAX", "[MED", "[SM", "]", "PAD")
_OPS = (10, 11, 12, 13)
_CLOSE, _PAD = 14, 15
_GRAPHS = ("arborescence", "independent", "gold")


class ListOpsBatch(NamedTuple):
    """A padded batch of ListOps expressions.

    B expressions padded to n = the longest.

    Fields:
        tokens: ``(B, n)`` long token ids (``LISTOPS_VOCAB``), ``PAD`` = 15 after the end.
        lengths: ``(B,)`` long sequence lengths.
        heads: ``(B, n)`` long, the gold head position of each token; −1 for the root (position
            0) and for padding.
        values: ``(B,)`` long, the expression's value in 0–9.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    heads: torch.Tensor
    values: torch.Tensor


class _Draws:
    """Uniform [0, 1) numbers drawn from a generator in blocks (one draw call per block)."""

    def __init__(self, generator: torch.Generator | None, block: int = 4096):
        self.generator, self.block = generator, block
        self.buf: list[float] = []

    def uniform(self) -> float:
        if not self.buf:
            self.buf = torch.rand(self.block, generator=self.generator,
                                  dtype=torch.float64).tolist()[::-1]
        return self.buf.pop()

    def integer(self, low: int, high: int) -> int:
        """Uniform on {low, …, high}."""
        return low + min(int(self.uniform() * (high - low + 1)), high - low)


def _apply(op: int, args: list[int]) -> int:
    if op == 10:
        return min(args)
    if op == 11:
        return max(args)
    if op == 12:
        return sorted(args)[(len(args) - 1) // 2]
    return sum(args) % 10


def _expression(draws: _Draws, depth: int, max_args: int, leaf_prob: float,
                tokens: list[int], heads: list[int], head: int) -> int:
    """Append one expression (prefix order) with its gold heads; return its value."""
    if depth == 0 or (head >= 0 and draws.uniform() < leaf_prob):
        tokens.append(draws.integer(0, 9))
        heads.append(head)
        return tokens[-1]
    op = _OPS[draws.integer(0, 3)]
    me = len(tokens)
    tokens.append(op)
    heads.append(head)
    args = [_expression(draws, depth - 1, max_args, leaf_prob, tokens, heads, me)
            for _ in range(draws.integer(2, max_args))]
    tokens.append(_CLOSE)
    heads.append(me)
    return _apply(op, args)


def make_listops(n_examples: int, max_depth: int = 3, max_args: int = 4, max_length: int = 25,
                 leaf_prob: float = 0.6,
                 generator: torch.Generator | None = None) -> ListOpsBatch:
    """Draw simplified ListOps expressions (module docstring) with their values and gold parses.

    The outermost node is an operator; every other node is a digit with probability
    ``leaf_prob`` (always at depth ``max_depth``), else an operator with 2..``max_args``
    arguments, each choice uniform. Expressions longer than ``max_length`` tokens are redrawn
    (rejection), so the distribution is the grammar's conditioned on the length bound.

    Args:
        n_examples: number of expressions B ≥ 1.
        max_depth: nesting depth bound ≥ 1.
        max_args: arguments per operator, ≥ 2.
        max_length: token bound, ≥ 2 + 2 (one operator over two digits needs 4 tokens).
        leaf_prob: probability that a non-root node is a digit, in [0, 1].
        generator: torch.Generator for reproducible draws (CPU).

    Returns:
        :class:`ListOpsBatch` padded to the longest expression.

    Shape: tokens, heads ``(B, n)``; lengths, values ``(B,)``; all ``torch.long`` on the CPU.

    Example::

        >>> b = make_listops(2, generator=torch.Generator().manual_seed(0))
        >>> b.tokens.shape[0], bool((b.heads[:, 0] == -1).all())
        (2, True)
    """
    n_examples = check_int(n_examples, "n_examples", low=1)
    max_depth = check_int(max_depth, "max_depth", low=1)
    max_args = check_int(max_args, "max_args", low=2)
    max_length = check_int(max_length, "max_length", low=4)
    if isinstance(leaf_prob, bool) or not isinstance(leaf_prob, (int, float)) or not (
            0.0 <= leaf_prob <= 1.0):
        raise ValueError(f"leaf_prob must be a probability in [0, 1], got {leaf_prob!r}")
    draws = _Draws(generator)
    seqs: list[list[int]] = []
    heads: list[list[int]] = []
    values: list[int] = []
    while len(seqs) < n_examples:
        t: list[int] = []
        h: list[int] = []
        v = _expression(draws, max_depth, max_args, float(leaf_prob), t, h, -1)
        if len(t) <= max_length:
            seqs.append(t)
            heads.append(h)
            values.append(v)
    n = max(len(s) for s in seqs)
    tokens = torch.full((n_examples, n), _PAD, dtype=torch.long)
    head_t = torch.full((n_examples, n), -1, dtype=torch.long)
    for b, (s, h) in enumerate(zip(seqs, heads)):
        tokens[b, :len(s)] = torch.tensor(s)
        head_t[b, :len(h)] = torch.tensor(h)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return ListOpsBatch(tokens, lengths, head_t, torch.tensor(values, dtype=torch.long))


def gold_arborescence(heads: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The gold parse as an adjacency: ``T[..., i, j] = 1`` iff ``heads[..., j] == i``.

    Shape: ``heads`` ``(*batch, n)`` long (−1: no head) -> ``(*batch, n, n)`` of ``dtype``.
    """
    if not isinstance(heads, torch.Tensor) or heads.is_floating_point() or heads.ndim < 1:
        raise ValueError("heads must be an integer tensor of shape (*batch, n), got "
                         f"{type(heads).__name__}"
                         + (f" of dtype {heads.dtype}" if isinstance(heads, torch.Tensor) else ""))
    n = heads.shape[-1]
    if bool(((heads < -1) | (heads >= n)).any()):
        raise ValueError(f"heads must lie in [-1, n - 1 = {n - 1}]")
    i = torch.arange(n, device=heads.device)
    return (heads.unsqueeze(-2) == i.unsqueeze(-1)).to(dtype)


def _real_nodes(lengths: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n, device=lengths.device) < lengths.unsqueeze(-1)


def arc_precision_recall(pred: torch.Tensor, gold: torch.Tensor,
                          lengths: torch.Tensor) -> tuple[float, float]:
    """Micro-averaged arc precision and recall of a 0/1 graph against the gold one.

    Arcs touching padding (positions ≥ length) and self-loops are ignored; an arc counts as
    predicted where ``pred > 0.5``. Precision = TP / predicted arcs, recall = TP / gold arcs
    (0 when there are none).

    Shape: ``pred``, ``gold`` ``(B, n, n)``; ``lengths`` ``(B,)``.
    """
    if pred.shape != gold.shape or pred.ndim != 3 or lengths.shape != pred.shape[:1]:
        raise ValueError(f"pred and gold must share a shape (B, n, n) and lengths be (B,), got "
                         f"{tuple(pred.shape)}, {tuple(gold.shape)}, {tuple(lengths.shape)}")
    n = pred.shape[-1]
    real = _real_nodes(lengths.to(pred.device), n)
    keep = real.unsqueeze(-1) & real.unsqueeze(-2) & ~torch.eye(n, dtype=torch.bool,
                                                                  device=pred.device)
    p, g = (pred > 0.5) & keep, (gold > 0.5) & keep
    tp = (p & g).sum().item()
    return tp / max(p.sum().item(), 1), tp / max(g.sum().item(), 1)


class LatentListOpsModel(nn.Module):
    """Encoder → arc scores → latent graph → GNN → value classifier (module docstring).

    Args:
        graph: ``"arborescence"`` (Tutte marginals of perturbed scores),
            ``"independent"`` (binary Concrete per arc) or ``"gold"`` (the true parse).
        dim: width of embeddings, encoder and GNN states (even).
        n_rounds: message-passing rounds (≥ the depth in arcs of the deepest token to carry
            every leaf to the root).
        tau: temperature τ of the relaxation.
        hard: straight-through (exact maximum arborescence / thresholded arcs forward).
        heads_precede: allow only arcs i → j with i < j (in prefix notation every head precedes
            its dependents: an order prior that keeps the gold parse feasible and shrinks the
            space of graphs); default False, all arcs allowed.
        noise: the perturbation of the arborescence's arc scores (default ``Gumbel()``; the
            seed compares ``Normal()`` and ``NegativeExponential()``). Not used by the other
            graphs.

    Shape: ``tokens`` ``(B, n)`` long, ``lengths`` ``(B,)`` -> logits ``(B, 10)`` and the graph
    ``(B, n, n)`` the GNN used (zero on padding).
    """

    def __init__(self, graph: str = "arborescence", dim: int = 64, n_rounds: int = 4,
                 tau: float = 1.0, hard: bool = False, heads_precede: bool = False,
                 noise: Noise | None = None):
        super().__init__()
        check_choice(graph, _GRAPHS, "graph")
        if noise is not None and not isinstance(noise, Noise):
            raise ValueError(f"noise must be a perturb.noise.Noise (e.g. Gumbel(), Normal()), "
                             f"got {type(noise).__name__}")
        self.noise: Noise = Gumbel() if noise is None else noise
        dim = check_int(dim, "dim", low=2)
        if dim % 2:
            raise ValueError(f"dim must be even (a BiLSTM of dim/2 per direction), got {dim}")
        check_tau(tau)
        self.graph, self.tau, self.hard = graph, float(tau), bool(hard)
        self.heads_precede = bool(heads_precede)
        self.n_rounds = check_int(n_rounds, "n_rounds", low=1)
        self.embed = nn.Embedding(len(LISTOPS_VOCAB), dim)
        self.encoder = nn.LSTM(dim, dim // 2, batch_first=True, bidirectional=True)
        self.head_mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.dep_mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.node_embed = nn.Embedding(len(LISTOPS_VOCAB), dim)
        self.message = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.update = nn.GRUCell(dim, dim)
        self.classify = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 10))

    def arc_scores(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Biaffine scores ``s[b, i, j]`` for head i → dependent j, masked for the solvers.

        Among real tokens every arc but self-loops and arcs into the root (position 0) is
        allowed (only i < j with ``heads_precede``); a padding position's only allowed arc is
        root → it, with score 0 (so both the marginals and the maximum arborescence put it
        there); forbidden arcs are ``-inf``.
        Shape ``(B, n, n)``.
        """
        H, _ = self.encoder(self.embed(tokens))
        s = self.head_mlp(H) @ self.dep_mlp(H).transpose(-1, -2) / H.shape[-1] ** 0.5
        n = tokens.shape[-1]
        real = _real_nodes(lengths, n)
        allowed = real.unsqueeze(-1) & real.unsqueeze(-2) & ~torch.eye(
            n, dtype=torch.bool, device=tokens.device)
        allowed[..., 0] = False
        if self.heads_precede:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)
        pad_arc = torch.zeros_like(allowed)
        pad_arc[..., 0, :] = ~real
        s = s.masked_fill(~allowed, -torch.inf)
        return s.masked_fill(pad_arc, 0.0)

    def _real_arcs(self, lengths: torch.Tensor, n: int) -> torch.Tensor:
        real = _real_nodes(lengths, n)
        return real.unsqueeze(-1) & real.unsqueeze(-2)

    def latent_graph(self, tokens: torch.Tensor, lengths: torch.Tensor,
                     heads: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """A sample of the relaxed graph (training), ``(B, n, n)``, zero on padding arcs."""
        n = tokens.shape[-1]
        real = self._real_arcs(lengths, n)
        if self.graph == "gold":
            if heads is None:
                raise ValueError('graph="gold" needs the gold heads')
            return gold_arborescence(heads, self.embed.weight.dtype) * real
        s = self.arc_scores(tokens, lengths)
        if self.graph == "arborescence":
            X = relax(s, Arborescences(0), self.noise, tau=self.tau, hard=self.hard,
                      generator=generator)
            return X * real
        finite = s.masked_fill(~torch.isfinite(s), 0.0)
        eps = Logistic().sample(s.shape, generator=generator, device=s.device, dtype=s.dtype)
        X = torch.sigmoid((finite + eps) / self.tau)
        if self.hard:
            X = (X > 0.5).to(X.dtype) + X - X.detach()
        return X * (real & torch.isfinite(s))

    @torch.no_grad()
    def mode_graph(self, tokens: torch.Tensor, lengths: torch.Tensor,
                   heads: torch.Tensor | None = None) -> torch.Tensor:
        """The most likely graph under the unperturbed scores, 0/1 ``(B, n, n)``, zero on
        padding: the maximum arborescence (Chu-Liu/Edmonds) or the arcs with ``s_ij > 0``."""
        n = tokens.shape[-1]
        real = self._real_arcs(lengths, n)
        if self.graph == "gold":
            return self.latent_graph(tokens, lengths, heads)
        s = self.arc_scores(tokens, lengths)
        if self.graph == "arborescence":
            return max_arborescence(s, root=0) * real
        return ((s > 0) & real).to(s.dtype)

    def classify_graph(self, tokens: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """GNN over the graph ``X`` (dependents → heads), logits of the root, ``(B, 10)``."""
        h = self.node_embed(tokens)
        B, n, d = h.shape
        for _ in range(self.n_rounds):
            agg = X @ self.message(h)                       # Σ_j X_ij m(h_j) at head i
            h = self.update(agg.reshape(B * n, d), h.reshape(B * n, d)).reshape(B, n, d)
        return self.classify(h[:, 0])

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor,
                heads: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Training: a relaxed graph sample; eval mode (``model.eval()``): the mode graph."""
        if self.training:
            X = self.latent_graph(tokens, lengths, heads, generator)
        else:
            X = self.mode_graph(tokens, lengths, heads)
        return self.classify_graph(tokens, X), X
