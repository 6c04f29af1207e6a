"""Train box embeddings on a hierarchy (a DAG) and measure how well they encode it.

Convention (as in :mod:`perturb.boxes.datasets`): the graph is a ``networkx.DiGraph`` whose
edges point ``child -> parent`` ("child IS-A parent"); node ``i`` of ``list(graph.nodes)`` gets
box ``i``, and a pair ``(child, parent)`` is predicted positive when

    log P(child ⊆ parent) = log E[Vol(parent ∩ child)] − log E[Vol(child)]  ≥  threshold

(:func:`~perturb.boxes.log_containment_prob`; hard, soft or Gumbel boxes).

Training minimises, over minibatches of positive edges E⁺ and ``k`` corrupted pairs per
positive (uniform head-or-tail corruption, filtered against the known positives and self pairs),

    L = mean_{E⁺} −log p  +  w · mean_{E⁻} −log(1 − p)  (+ λ · Σ 1[Vol > τ_v]·Vol),

with p = P(child ⊆ parent) and log(1 − p) from :func:`~perturb.boxes.log1m_containment_prob`
(accurate when a Gumbel child lies deep inside its parent and p rounds to 1, so a wrongly nested
negative keeps a gradient; log1mexp(log p) otherwise). For hard boxes a
disjoint positive pair has p = 0: its loss is floored at −log p = 100 with zero gradient, which
is exactly the flat region Gumbel boxes remove (Dasgupta et al. 2020). The training-health
metrics record it: the fraction of *stalled* pairs (violated pairs, positives with p < 1/2 or
negatives with p > 1/2, whose own loss has an exactly zero gradient), the fraction of
(near-)zero gradient entries among the parameters of the boxes that a step touches, the
distribution of log volumes, and the containment accuracy. The two gradient metrics differ for
Gumbel boxes: late in training a few percent of their gradient entries are (near-)zero, but
those belong to *satisfied* pairs (a child deep inside its parent, where the intersection
corner equals the child's corner to float precision and the two volume terms cancel; a
negative so far apart that p underflows), while no violated pair ever stalls.

Evaluation (:func:`evaluate`) scores pairs by log P, picks the threshold maximising F1 over the
given pairs (the *reconstruction* setting, or the validation split of the *generalisation*
setting, see :func:`~perturb.boxes.datasets.split_hierarchy`) or applies a given one, and
returns precision, recall and F1.

References:
    Vilnis et al. 2018, arXiv:1805.06627; Li et al. 2019 (soft boxes, ICLR 2019);
    Dasgupta et al. 2020, "Improving Local Identifiability in Probabilistic Box Embeddings",
    arXiv:2010.04831; Nickel & Kiela 2017 and Ganea et al. 2018 (WordNet settings).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import networkx as nx
import torch
from torch import nn

from perturb._validation import check_choice, check_int, check_tau
from perturb.boxes.box import Box
from perturb.boxes.datasets import check_hierarchy, transitive_closure
from perturb.boxes.embedding import BoxEmbedding
from perturb.boxes.intersection import _log1m_containment, intersection, log_containment_prob
from perturb.boxes.losses import _is_member, _negative_nll
from perturb.boxes.volume import volume

__all__ = [
    "BoxHierarchyModel",
    "TrainHistory",
    "TrainResult",
    "EvalResult",
    "train_hierarchy",
    "evaluate",
    "best_f1_threshold",
    "score_all_pairs",
    "all_pairs_f1",
    "edge_index",
    "VOLUME_QUANTILES",
]

_METHODS = ("gumbel", "soft", "hard")
#: Quantile levels of the log-volume distribution recorded each epoch.
VOLUME_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: −log p of a hard positive pair whose boxes are disjoint (p = 0): finite, zero gradient.
_HARD_LOG_FLOOR = -100.0


class BoxHierarchyModel(nn.Module):
    """Boxes for the nodes of a hierarchy, with the box model used to score pairs.

    Wraps a :class:`~perturb.boxes.BoxEmbedding` (its own ``beta`` unused) and fixes how
    containment is computed: ``method="gumbel"`` (Gumbel intersection with scale ``beta``,
    expected volumes with scale ``volume_beta``; ``volume_beta=None`` uses ``beta``), ``"soft"``
    (hard intersection, softplus volumes with ``temperature``) or ``"hard"``.

    Args:
        num_nodes, dim: number of boxes and their dimension.
        method: "gumbel", "soft" or "hard".
        beta, volume_beta: Gumbel scales (``method="gumbel"`` only).
        temperature: softplus temperature (``method="soft"`` only).
        nodes: the node labels, ``nodes[i]`` owning box ``i`` (default ``range(num_nodes)``).
        parameterisation, init, generator, dtype, device: passed to ``BoxEmbedding``.

    Shape:
        :meth:`log_containment`: ids ``(*batch,)`` -> ``(*batch,)``.
    """

    def __init__(self, num_nodes: int, dim: int, method: str = "gumbel", *,
                 beta: float = 0.01, volume_beta: float | None = 0.1, temperature: float = 0.1,
                 nodes: Sequence[Hashable] | None = None, parameterisation: str = "center_offset",
                 init: float | Sequence[float] = (0.1, 0.5),
                 generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_choice(method, _METHODS, "method")
        check_tau(beta, "beta")
        check_tau(temperature, "temperature")
        if volume_beta is not None:
            check_tau(volume_beta, "volume_beta")
        self.method = method
        self.beta = float(beta)
        self.volume_beta = float(volume_beta) if volume_beta is not None else None
        self.temperature = float(temperature)
        self.embedding = BoxEmbedding(num_nodes, dim, beta=None, parameterisation=parameterisation,
                                      init=init, generator=generator, dtype=dtype, device=device)
        self.nodes = list(nodes) if nodes is not None else list(range(num_nodes))
        if len(self.nodes) != num_nodes:
            raise ValueError(f"nodes must have num_nodes={num_nodes} labels, got {len(self.nodes)}")

    @property
    def num_nodes(self) -> int:
        return self.embedding.num_entities

    @property
    def dim(self) -> int:
        return self.embedding.dim

    def forward(self, ids: torch.Tensor) -> Box:
        """The boxes of ``ids``."""
        return self.embedding(ids)

    def _box_kwargs(self) -> dict[str, Any]:
        if self.method == "gumbel":
            return {"beta": self.beta, "volume_beta": self.volume_beta}
        if self.method == "soft":
            return {"temperature": self.temperature}
        return {}

    def log_containment_boxes(self, parent: Box, child: Box) -> torch.Tensor:
        """log P(child ⊆ parent) for given boxes under this model's box model."""
        return log_containment_prob(parent, child, **self._box_kwargs())

    def log_containment(self, child: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
        """log P(child ⊆ parent) for node ids (note the argument order: child first, as in the
        edges ``child -> parent``).

        Same value as :meth:`log_containment_boxes` (``log E[Vol(parent ∩ child)] −
        log E[Vol(child)]``, clamped at 0), but the child volumes are computed once per node
        (when there are at least as many pairs as nodes) rather than once per pair: this halves
        the Bessel evaluations of a training step with many negatives.
        """
        return self.log_containment_pair(child, parent)[0]

    def log_containment_pair(self, child: torch.Tensor, parent: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P, log(1 − P))`` of ``child ⊆ parent`` for node ids; the second is accurate
        for Gumbel children deep inside their parents, where P rounds to 1
        (:func:`~perturb.boxes.log1m_containment_prob`). What training uses."""
        if child.numel() >= self.num_nodes:
            log_child = self.log_volume()[child]
        else:
            log_child = self.log_volume(child)
        pb, cb = self(parent), self(child)
        log_p = self._log_containment(pb, cb, log_child)
        return log_p, self._log1m_containment(pb, cb, log_p)

    def _log1m_containment(self, parent: Box, child: Box, log_p: torch.Tensor) -> torch.Tensor:
        gumbel = self.method == "gumbel"
        return _log1m_containment(log_p, parent, child, self.beta if gumbel else None,
                                  (self.volume_beta or self.beta) if gumbel else None, False)

    def _log_containment(self, parent: Box, child: Box, log_child: torch.Tensor
                         ) -> torch.Tensor:
        """log P(child ⊆ parent) given the boxes and the child's log volume."""
        inter = intersection(parent, child, self.beta if self.method == "gumbel" else None)
        out = self._log_volume_box(inter) - log_child
        if self.method == "hard":          # an empty hard child is contained in anything
            out = torch.where(torch.isneginf(log_child), torch.zeros_like(out), out)
        return out.clamp(max=0.0)

    def log_volume(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Log (expected) volume of the boxes of ``ids`` (all boxes when None)."""
        return self._log_volume_box(self.embedding.all_boxes() if ids is None else self(ids))

    def _log_volume_box(self, box: Box) -> torch.Tensor:
        if self.method == "gumbel":
            return volume(box, "gumbel", beta=self.volume_beta or self.beta, log=True)
        if self.method == "soft":
            return volume(box, "soft", temperature=self.temperature, log=True)
        return volume(box, "hard", log=True)

    def extra_repr(self) -> str:
        extra = {"gumbel": f", beta={self.beta}, volume_beta={self.volume_beta}",
                 "soft": f", temperature={self.temperature}", "hard": ""}[self.method]
        return f"method={self.method!r}{extra}"


@dataclasses.dataclass
class TrainHistory:
    """What :func:`train_hierarchy` recorded.

    Per step: ``step_loss``, ``zero_grad_fraction`` (fraction of the gradient entries of the
    boxes in the batch with ``|g| <= grad_tol``), ``stalled_fraction`` (of the *violated* pairs
    of the step, positives with p < 1/2 and negatives with p > 1/2, the fraction whose own loss
    has a zero gradient with respect to both boxes; 0 when none is violated). Per epoch:
    ``loss`` (mean over steps), ``epoch_zero_grad_fraction``, ``epoch_stalled_fraction``
    (stalled / violated pairs over the epoch), ``epoch_violated_fraction`` (violated / all
    pairs), ``volume_quantiles`` (``(epochs, 5)`` log-volume quantiles at
    :data:`VOLUME_QUANTILES`, after the epoch), ``containment_accuracy`` (fraction of the
    training positives with P(child ⊆ parent) ≥ ``accuracy_threshold``), ``eval`` (what
    ``eval_fn`` returned, with its ``"epoch"``), ``seconds`` (wall-clock time of each epoch).
    """

    step_loss: list[float] = dataclasses.field(default_factory=list)
    zero_grad_fraction: list[float] = dataclasses.field(default_factory=list)
    stalled_fraction: list[float] = dataclasses.field(default_factory=list)
    loss: list[float] = dataclasses.field(default_factory=list)
    epoch_zero_grad_fraction: list[float] = dataclasses.field(default_factory=list)
    epoch_stalled_fraction: list[float] = dataclasses.field(default_factory=list)
    epoch_violated_fraction: list[float] = dataclasses.field(default_factory=list)
    volume_quantiles: list[list[float]] = dataclasses.field(default_factory=list)
    containment_accuracy: list[float] = dataclasses.field(default_factory=list)
    eval: list[dict] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)


class TrainResult(NamedTuple):
    """``model`` (a :class:`BoxHierarchyModel`) and its :class:`TrainHistory`."""

    model: BoxHierarchyModel
    history: TrainHistory


class EvalResult(NamedTuple):
    """Precision, recall and F1 of the pairs predicted positive (``score >= threshold``, on the
    log P(child ⊆ parent) scale), with the counts behind them."""

    precision: float
    recall: float
    f1: float
    threshold: float
    true_positives: int
    predicted_positives: int
    positives: int


# ----------------------------------------------------------------------------- helpers

def edge_index(graph: nx.DiGraph, edges: Any = None) -> torch.Tensor:
    """``(m, 2)`` LongTensor of ``(child, parent)`` positions in ``list(graph.nodes)``, for the
    given edges (node labels) or, when None, for ``graph.edges``."""
    index = {u: i for i, u in enumerate(graph.nodes)}
    edges = graph.edges if edges is None else edges
    try:
        rows = [(index[u], index[v]) for u, v in edges]
    except KeyError as exc:
        raise ValueError(f"edge endpoint {exc.args[0]!r} is not a node of the graph") from None
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 2)


def _check_pairs(pairs: torch.Tensor, num_nodes: int, name: str) -> torch.Tensor:
    if not isinstance(pairs, torch.Tensor) or pairs.is_floating_point() \
            or pairs.dtype == torch.bool or pairs.ndim != 2 or pairs.shape[-1] != 2:
        got = tuple(pairs.shape) if isinstance(pairs, torch.Tensor) else type(pairs).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (m, 2) holding "
                         f"(child, parent) ids, got {got}")
    if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= num_nodes):
        raise ValueError(f"{name} holds ids outside [0, {num_nodes})")
    return pairs.long()


def best_f1_threshold(scores: torch.Tensor, labels: torch.Tensor) -> EvalResult:
    """The threshold maximising F1 of ``scores >= threshold`` against binary ``labels``.

    Sorts once (O(m log m)) and evaluates F1 = 2·TP / (#predicted + #positives) at every
    distinct score (ties are predicted together).

    Shape:
        ``scores``, ``labels``: ``(m,)``.
    """
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D of the same shape, got "
                         f"{tuple(scores.shape)} and {tuple(labels.shape)}")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN")
    lab = labels.to(torch.bool)
    positives = int(lab.sum())
    if scores.numel() == 0 or positives == 0:
        return EvalResult(0.0, 0.0, 0.0, math.inf, 0, 0, positives)
    order = torch.argsort(scores, descending=True, stable=True)
    s = scores[order]
    tp = torch.cumsum(lab[order].to(torch.float64), 0)
    k = torch.arange(1, s.numel() + 1, dtype=torch.float64, device=s.device)
    last = torch.ones_like(lab)
    last[:-1] = s[:-1] != s[1:]
    f1 = torch.where(last, 2.0 * tp / (k + positives), torch.full_like(tp, -1.0))
    i = int(torch.argmax(f1))
    tpi, ki = int(tp[i]), int(k[i])
    return EvalResult(tpi / ki, tpi / positives, float(f1[i]), float(s[i]), tpi, ki, positives)


def _prf(pred: torch.Tensor, lab: torch.Tensor, threshold: float) -> EvalResult:
    tp = int((pred & lab).sum())
    npred, npos = int(pred.sum()), int(lab.sum())
    p = tp / npred if npred else 0.0
    r = tp / npos if npos else 0.0
    f1 = 2 * tp / (npred + npos) if npred + npos else 0.0
    return EvalResult(p, r, f1, threshold, tp, npred, npos)


@torch.no_grad()
def _scores(model: BoxHierarchyModel, pairs: torch.Tensor, batch_size: int) -> torch.Tensor:
    dev = model.embedding.param1.device
    out = [model.log_containment(chunk[:, 0].to(dev), chunk[:, 1].to(dev))
           for chunk in pairs.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, device=dev)


def evaluate(model: BoxHierarchyModel, pairs: torch.Tensor, labels: torch.Tensor,
             threshold: float | None = None, *, batch_size: int = 65536) -> EvalResult:
    """Precision, recall and F1 of ``log P(child ⊆ parent) >= threshold`` on labelled pairs.

    Args:
        model: trained boxes.
        pairs: ``(m, 2)`` ``(child, parent)`` node ids.
        labels: ``(m,)`` 1 for true pairs, 0 otherwise.
        threshold: on the log-probability scale; None picks the best-F1 threshold over these
            pairs (:func:`best_f1_threshold`) - use it on a validation split, or over all pairs
            in the reconstruction setting; then apply the returned ``threshold`` to test pairs.
        batch_size: pairs scored at once.

    Returns:
        :class:`EvalResult`.

    Raises:
        ValueError: misshaped pairs/labels, ids out of range.

    Example:
        >>> val = evaluate(model, val_pairs, val_labels)                    # doctest: +SKIP
        >>> test = evaluate(model, test_pairs, test_labels, val.threshold)   # doctest: +SKIP
    """
    pairs = _check_pairs(pairs, model.num_nodes, "pairs")
    if labels.shape != pairs.shape[:1]:
        raise ValueError(f"labels must have shape ({pairs.shape[0]},), got {tuple(labels.shape)}")
    scores = _scores(model, pairs, batch_size)
    lab = labels.to(device=scores.device, dtype=torch.bool)
    if threshold is None:
        return best_f1_threshold(scores, lab)
    return _prf(scores >= threshold, lab, float(threshold))


@torch.no_grad()
def score_all_pairs(model: BoxHierarchyModel, *, chunk_elements: int = 2 ** 22) -> torch.Tensor:
    """``(n, n)`` matrix of log P(child ⊆ parent), child = row, parent = column (diagonal
    included), computed in row chunks by broadcasting. Memory O(n²); for n up to ~10⁴."""
    boxes = model.embedding.all_boxes()
    n, d = model.num_nodes, model.dim
    rows = max(1, chunk_elements // max(1, n * d))
    out = []
    for start in range(0, n, rows):
        child = boxes[start:start + rows]
        child = Box(child.lower.unsqueeze(1), child.upper.unsqueeze(1))       # (r, 1, d)
        parent = Box(boxes.lower.unsqueeze(0), boxes.upper.unsqueeze(0))      # (1, n, d)
        out.append(model.log_containment_boxes(parent, child))
    return torch.cat(out)


def all_pairs_f1(model: BoxHierarchyModel, positives: torch.Tensor,
                 threshold: float | None = None) -> EvalResult:
    """F1 over all ordered pairs ``(u, v)``, ``u != v`` (the reconstruction setting): the
    positives are the given ``(child, parent)`` edges (normally the transitive closure), every
    other pair is negative; best threshold when ``threshold`` is None."""
    n = model.num_nodes
    positives = _check_pairs(positives, n, "positives")
    scores = score_all_pairs(model)
    lab = torch.zeros(n, n, dtype=torch.bool, device=scores.device)
    lab[positives[:, 0].to(scores.device), positives[:, 1].to(scores.device)] = True
    off = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    s, lab = scores[off], lab[off]
    if threshold is None:
        return best_f1_threshold(s, lab)
    return _prf(s >= threshold, lab, float(threshold))


# ----------------------------------------------------------------------------- training

def _pair_terms(log_p: torch.Tensor, log1m_p: torch.Tensor, positive: torch.Tensor,
                method: str) -> torch.Tensor:
    """Per-pair loss: −log p where ``positive``, −log(1 − p) elsewhere."""
    if method == "hard":
        log_p = log_p.clamp(min=_HARD_LOG_FLOOR)        # p = 0: finite loss, zero gradient
    # p = 1 exactly (hard or soft boxes nested): the finite loss −log(eps), zero gradient
    return torch.where(positive, -log_p, _negative_nll(log1m_p))


def _pair_loss(log_p: torch.Tensor, log1m_p: torch.Tensor, n_pos: int, method: str,
               negative_weight: float) -> torch.Tensor:
    """mean −log p over the first ``n_pos`` pairs + w · mean −log(1 − p) over the rest."""
    positive = torch.arange(log_p.shape[0], device=log_p.device) < n_pos
    terms = _pair_terms(log_p, log1m_p, positive, method)
    loss = terms[:n_pos].mean()
    if log_p.shape[0] > n_pos:
        loss = loss + negative_weight * terms[n_pos:].mean()
    return loss


def _stalled_pairs(model: BoxHierarchyModel, pairs: torch.Tensor, log_p: torch.Tensor,
                   n_pos: int, grad_tol: float, max_pairs: int = 4096) -> tuple[float, int]:
    """``(stalled, violated)``: the pairs of a step that the loss still penalises (positives
    with p < 1/2, negatives with p > 1/2) and, among them, those whose own loss term has a zero
    gradient (``|g| <= grad_tol`` for every corner coordinate of both boxes). A stalled pair is
    the local non-identifiability of Dasgupta et al.: wrong, and nothing moves it (hard boxes
    that are disjoint, or nested, have such pairs; Gumbel boxes have none). The gradients come
    from one extra backward pass over at most ``max_pairs`` violated pairs (an evenly spaced
    sample when there are more; ``stalled`` is then scaled up to all of them)."""
    positive = torch.arange(log_p.shape[0], device=log_p.device) < n_pos
    half = -math.log(2.0)
    violated = torch.where(positive, log_p.detach() < half, log_p.detach() > half)
    idx = violated.nonzero().flatten()
    n_violated = idx.numel()
    if n_violated == 0:
        return 0.0, 0
    if n_violated > max_pairs:     # an evenly spaced sample (no randomness: training unchanged)
        idx = idx[torch.linspace(0, n_violated - 1, max_pairs, device=idx.device).long()]
    with torch.enable_grad():
        child, parent = model(pairs[idx, 0]), model(pairs[idx, 1])
        corners = [t.detach().requires_grad_() for t in
                   (child.lower, child.upper, parent.lower, parent.upper)]
        cb, pb = Box(corners[0], corners[1]), Box(corners[2], corners[3])
        lp = model._log_containment(pb, cb, model._log_volume_box(cb))
        terms = _pair_terms(lp, model._log1m_containment(pb, cb, lp), positive[idx],
                            model.method)
        grads = torch.autograd.grad(terms.sum(), corners, allow_unused=True)
    # rows are independent, so the gradient of the sum holds each pair's own gradient
    size = torch.zeros(idx.numel(), dtype=lp.dtype, device=lp.device)
    for g in grads:
        if g is not None:
            size = torch.maximum(size, g.abs().amax(dim=-1))
    return float((size <= grad_tol).sum()) * n_violated / idx.numel(), n_violated


def _pair_codes(pairs: torch.Tensor, n: int) -> torch.Tensor:
    return pairs[..., 0] * n + pairs[..., 1]


def _sample_negatives(pos: torch.Tensor, n: int, k: int, known_codes: torch.Tensor,
                      generator: torch.Generator, max_rounds: int = 100) -> torch.Tensor:
    """``k`` negatives per positive ``(child, parent)``: replace the child or the parent (each
    with probability 1/2) by a uniform node; draws that hit ``known_codes`` (sorted pair codes
    ``child * n + parent``, self pairs included) are redrawn, side included, up to
    ``max_rounds`` times (a draw still bad after that is kept). Membership is a binary search
    (``torch.searchsorted``), O(m log |known|).

    Same distribution as :func:`perturb.boxes.sample_negatives` with ``corrupt="both"``; this
    one excludes self pairs and never raises, which training needs.

    Shape:
        ``pos``: ``(m, 2)`` -> ``(m * k, 2)``.
    """
    base = pos.repeat_interleave(k, dim=0)
    neg = base.clone()
    todo = torch.arange(neg.shape[0])
    for _ in range(max_rounds):
        if todo.numel() == 0:
            break
        ent = torch.randint(n, (todo.numel(),), generator=generator)
        side = torch.randint(2, (todo.numel(),), generator=generator)
        rows = base[todo].clone()
        rows[torch.arange(todo.numel()), side] = ent
        neg[todo] = rows
        todo = todo[_is_member(_pair_codes(rows, n), known_codes)]
    return neg


def _resolve_generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator:
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if generator is not None:
        return generator
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def _progress(iterable: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:                      # tqdm is an optional dependency
        return iterable
    return tqdm(iterable, desc=desc, leave=False)


def _train_pairs(graph: nx.DiGraph, train_edges: Any, closure: bool) -> torch.Tensor:
    n = graph.number_of_nodes()
    if train_edges is None:
        g = transitive_closure(graph) if closure else graph
        return edge_index(graph, g.edges)
    if isinstance(train_edges, torch.Tensor):
        return _check_pairs(train_edges, n, "train_edges")
    return edge_index(graph, train_edges)


@torch.no_grad()
def _volume_quantiles(model: BoxHierarchyModel) -> list[float]:
    logv = model.log_volume().double().cpu().clamp(min=-1e300)   # empty hard box: -inf
    q = torch.tensor(VOLUME_QUANTILES, dtype=torch.float64)
    return torch.quantile(logv, q).tolist()


def train_hierarchy(graph: nx.DiGraph, dim: int, method: str = "gumbel", *,
                    beta: float = 0.01, volume_beta: float | None = 0.1,
                    temperature: float = 0.1, epochs: int = 100, lr: float = 0.05,
                    negatives_per_positive: int = 10, batch_size: int = 512,
                    negative_weight: float = 1.0, volume_reg: float = 0.0,
                    volume_threshold: float = 0.5, train_edges: Any = None,
                    closure: bool = True, known_edges: torch.Tensor | None = None,
                    parameterisation: str = "center_offset",
                    init: float | Sequence[float] = (0.1, 0.5),
                    generator: torch.Generator | None = None, seed: int | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                    progress: bool = True, grad_tol: float = 1e-12,
                    accuracy_threshold: float = 0.5,
                    eval_fn: Callable[[BoxHierarchyModel], dict] | None = None,
                    eval_every: int = 0, model: BoxHierarchyModel | None = None) -> TrainResult:
    """Fit boxes so that ``child ⊆ parent`` for the edges of a hierarchy (module docstring).

    Args:
        graph: ``networkx.DiGraph``, edges ``child -> parent``, acyclic. Box ``i`` belongs to
            ``list(graph.nodes)[i]``.
        dim: box dimension d.
        method: "gumbel", "soft" or "hard" (see :class:`BoxHierarchyModel`).
        beta, volume_beta: Gumbel intersection / volume scales. The defaults (0.01, 0.1) follow
            Dasgupta et al.: a sharp intersection and a smoother volume; with a single scale
            (``volume_beta=None``) training is much slower to reach the same F1.
        temperature: softplus temperature of soft volumes.
        epochs: passes over the positive edges.
        lr: Adam learning rate.
        negatives_per_positive: k corrupted pairs per positive edge, redrawn every step.
        batch_size: positive edges per step (each with its k negatives).
        negative_weight: w, weight of the mean negative loss.
        volume_reg, volume_threshold: λ and τ_v of the volume regulariser (off when λ = 0).
        train_edges: the positive ``(child, parent)`` pairs, as an ``(m, 2)`` tensor of node
            positions or an iterable of node-label pairs; default: the transitive closure of
            ``graph`` (``closure=True``) or its edges.
        known_edges: ``(m, 2)`` pairs never drawn as negatives (default: the training
            positives; self pairs are always excluded).
        parameterisation, init: box parameterisation and initial side range (BoxEmbedding).
        generator, seed: randomness of initialisation, shuffling and negatives (one of them).
        device, dtype: where and in which precision to train.
        progress: show a tqdm bar over epochs (when tqdm is installed).
        grad_tol: a gradient entry counts as zero when ``|g| <= grad_tol``.
        accuracy_threshold: P level for the containment accuracy.
        eval_fn, eval_every: call ``eval_fn(model)`` (in eval mode, no grad) every
            ``eval_every`` epochs and after the last; the dicts go to ``history.eval``.
        model: continue training this model instead of creating one (``method``, ``beta``...
            and ``init`` are then ignored).

    Returns:
        :class:`TrainResult` ``(model, history)``.

    Raises:
        ValueError: a cyclic or non-DiGraph ``graph``, bad hyper-parameters, edges whose
            endpoints are not nodes.

    Example:
        >>> from perturb.boxes.datasets import balanced_tree
        >>> res = train_hierarchy(balanced_tree(2, 3), dim=2, epochs=5, seed=0, progress=False)
        >>> len(res.history.loss)
        5
    """
    n, pos, gen = _prepare(graph, dim, epochs, negatives_per_positive, batch_size, lr,
                           eval_every, volume_reg, negative_weight, generator, seed,
                           train_edges, closure)
    if model is None:
        model = BoxHierarchyModel(n, dim, method, beta=beta, volume_beta=volume_beta,
                                  temperature=temperature, nodes=list(graph.nodes),
                                  parameterisation=parameterisation, init=init, generator=gen,
                                  dtype=dtype, device=device)
    elif model.num_nodes != n or model.dim != dim:
        raise ValueError(f"model has {model.num_nodes} boxes of dim {model.dim}, the graph "
                         f"needs {n} of dim {dim}")
    cfg = _StepConfig(n, negatives_per_positive, _known_codes(pos, known_edges, n),
                      negative_weight, volume_reg, volume_threshold, grad_tol)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    hist = TrainHistory()
    acc_sample = pos[torch.randperm(pos.shape[0], generator=gen)[:65536]]
    bar = _progress(range(epochs), progress, f"{model.method} d={model.dim}")
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(pos.shape[0], generator=gen)
        steps = [_train_step(model, model.log_containment_pair, opt, pos[idx], cfg, gen)
                 for idx in perm.split(batch_size)]
        _end_epoch(model, hist, steps, acc_sample, accuracy_threshold, epoch, epochs,
                   eval_fn, eval_every, t0, bar)
    model.eval()
    return TrainResult(model, hist)


class _StepConfig(NamedTuple):
    n: int
    k: int
    known_codes: torch.Tensor
    negative_weight: float
    volume_reg: float
    volume_threshold: float
    grad_tol: float


def _prepare(graph: nx.DiGraph, dim: int, epochs: int, negatives_per_positive: int,
             batch_size: int, lr: float, eval_every: int, volume_reg: float,
             negative_weight: float, generator: torch.Generator | None, seed: int | None,
             train_edges: Any, closure: bool) -> tuple[int, torch.Tensor, torch.Generator]:
    """Validate the training arguments; return (number of nodes, positive pairs, generator)."""
    check_hierarchy(graph)
    n = graph.number_of_nodes()
    if n < 2:
        raise ValueError(f"graph must have at least 2 nodes, got {n}")
    check_int(dim, "dim", low=1)
    check_int(epochs, "epochs", low=0)
    check_int(negatives_per_positive, "negatives_per_positive", low=0)
    check_int(batch_size, "batch_size", low=1)
    check_tau(lr, "lr")
    check_int(eval_every, "eval_every", low=0)
    if volume_reg < 0 or negative_weight < 0:
        raise ValueError(f"volume_reg and negative_weight must be >= 0, got {volume_reg!r} "
                         f"and {negative_weight!r}")
    gen = _resolve_generator(generator, seed)
    pos = _train_pairs(graph, train_edges, closure)
    if pos.shape[0] == 0:
        raise ValueError("there are no training edges")
    return n, pos, gen


def _known_codes(pos: torch.Tensor, known_edges: torch.Tensor | None, n: int) -> torch.Tensor:
    """Sorted codes of the pairs never used as negatives: the known edges and self pairs."""
    known = pos if known_edges is None else _check_pairs(known_edges, n, "known_edges")
    diag = torch.arange(n).unsqueeze(1).expand(n, 2)
    return torch.unique(_pair_codes(torch.cat([known.cpu(), diag]), n))


def _train_step(model: BoxHierarchyModel, score: Callable[[torch.Tensor, torch.Tensor],
                tuple[torch.Tensor, torch.Tensor]], opt: torch.optim.Optimizer, batch: torch.Tensor,
                cfg: _StepConfig, gen: torch.Generator) -> tuple[float, float, float, float, float]:
    """One optimiser step on a batch of positives and their fresh negatives; returns the loss,
    the fraction of zero gradient entries among the boxes the step touched, and the numbers of
    stalled, violated (:func:`_stalled_pairs`, before the step) and all pairs. ``score`` is
    ``model.log_containment_pair`` or a DDP wrapper of it (same signature)."""
    dev = model.embedding.param1.device
    if cfg.k:
        pairs = torch.cat([batch, _sample_negatives(batch, cfg.n, cfg.k, cfg.known_codes, gen)])
    else:
        pairs = batch
    pairs = pairs.to(dev)
    log_p, log1m_p = score(pairs[:, 0], pairs[:, 1])
    loss = _pair_loss(log_p, log1m_p, batch.shape[0], model.method, cfg.negative_weight)
    touched = torch.zeros(cfg.n, dtype=torch.bool, device=dev)
    touched[pairs.flatten()] = True
    if cfg.volume_reg > 0:
        vol = torch.exp(model.log_volume()[touched])
        loss = loss + cfg.volume_reg * torch.where(vol > cfg.volume_threshold, vol,
                                                   torch.zeros_like(vol)).sum()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    with torch.no_grad():
        params = (model.embedding.param1, model.embedding.param2)
        g = torch.cat([p.grad[touched] for p in params], dim=-1)
        zero = float((g.abs() <= cfg.grad_tol).double().mean())
    stalled, violated = _stalled_pairs(model, pairs, log_p, batch.shape[0], cfg.grad_tol)
    opt.step()
    return float(loss.detach()), zero, float(stalled), float(violated), float(len(pairs))


def _end_epoch(model: BoxHierarchyModel, hist: TrainHistory, steps: list[tuple[float, ...]],
               acc_sample: torch.Tensor, accuracy_threshold: float, epoch: int, epochs: int,
               eval_fn: Callable[[BoxHierarchyModel], dict] | None, eval_every: int,
               t0: float, bar: Any) -> None:
    """Record the epoch's step metrics, volume quantiles, containment accuracy and eval."""
    losses = [s[0] for s in steps]
    zeros = [s[1] for s in steps]
    hist.step_loss.extend(losses)
    hist.zero_grad_fraction.extend(zeros)
    hist.loss.append(sum(losses) / max(1, len(losses)))
    hist.epoch_zero_grad_fraction.append(sum(zeros) / max(1, len(zeros)))
    stalled, violated = sum(s[2] for s in steps), sum(s[3] for s in steps)
    hist.stalled_fraction.extend(s[2] / s[3] if s[3] else 0.0 for s in steps)
    hist.epoch_stalled_fraction.append(stalled / violated if violated else 0.0)
    hist.epoch_violated_fraction.append(violated / max(1.0, sum(s[4] for s in steps)))
    model.eval()
    with torch.no_grad():
        hist.volume_quantiles.append(_volume_quantiles(model))
        lp = _scores(model, acc_sample, 65536)
        hist.containment_accuracy.append(
            float((lp >= math.log(accuracy_threshold)).double().mean()))
        if eval_fn is not None and eval_every and ((epoch + 1) % eval_every == 0
                                                   or epoch + 1 == epochs):
            hist.eval.append({"epoch": epoch + 1, **eval_fn(model)})
    hist.seconds.append(time.perf_counter() - t0)
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(loss=f"{hist.loss[-1]:.4f}",
                        zero_grad=f"{hist.epoch_zero_grad_fraction[-1]:.2f}",
                        stalled=f"{hist.epoch_stalled_fraction[-1]:.2f}")
