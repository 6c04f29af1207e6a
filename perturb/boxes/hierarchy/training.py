"""Training box embeddings on a hierarchy: loss, a device-resident step, diagnostics on a
schedule, checkpoints.

Training minimises, over minibatches of positive edges E⁺ and ``k`` corrupted pairs per
positive (head-or-tail corruption filtered against the known pairs and self pairs,
:func:`~perturb.boxes.sample_negatives`),

    L = mean_{E⁺} −log p  +  w · mean_{E⁻} −log(1 − p)  (+ λ · Σ_{touched boxes} 1[Vol > τ_v]·Vol),

with p = P(child ⊆ parent) and log(1 − p) accurate for Gumbel children deep inside their
parents (:class:`~perturb.boxes.hierarchy.BoxHierarchyModel`). For hard boxes a disjoint
positive pair has p = 0: its loss is floored at −log p = 100 with zero gradient, the flat region
that Gumbel boxes remove (Dasgupta et al. 2020).

Where the work happens. The positives, the sorted codes of the known pairs
(:class:`~perturb.boxes.losses.PairSet`) and the generator of shuffling and negatives live on
the training device; negatives are drawn and filtered there (binary search), the step's loss
is kept on the device, and the host reads the metrics of an epoch once, at its end. The step
itself reads nothing back (with ``sampler="fixed"``; the CPU default, ``"adaptive"``, reads one
flag per rejection round, which costs nothing on a CPU). What still synchronises inside the box
operations themselves (regime checks in :mod:`perturb.boxes.volumes` and
:mod:`perturb.boxes.intersections`) is counted in ``docs/box_hierarchy.md``.

Diagnostics (:class:`TrainHistory`) run on a schedule (``HierarchyConfig.diagnostics_every``):
on the first step of each epoch and every N steps after it. A diagnostic step measures

- the *zero-gradient fraction*: the fraction of the gradient entries of the boxes the step
  touches with ``|g| <= grad_tol``;
- the *stalled fraction*: of the *violated* pairs (positives with p < 1/2, negatives with
  p > 1/2), those whose own loss term has a zero gradient with respect to both boxes' corners
  (one extra backward pass over the step's pairs, with every pair's corners detached so that
  each gets its own gradient; the training gradients are untouched). Hard boxes stall on
  disjoint positives and nested negatives; Gumbel boxes never do;
- how many negatives still hit a known pair (possible only when ``negative_max_tries`` draws
  all failed).

References:
    Vilnis et al. 2018, arXiv:1805.06627; Li et al. 2019 (soft boxes, ICLR 2019);
    Dasgupta et al. 2020, arXiv:2010.04831; Nickel & Kiela 2017; Ganea et al. 2018.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, NamedTuple

import networkx as nx
import torch

from perturb.boxes.box import Box
from perturb.boxes.hierarchy._lazy_adam import LazyAdam
from perturb.boxes.hierarchy.config import HierarchyConfig
from perturb.boxes.hierarchy.graphs import (check_hierarchy, check_pairs, edge_index,
                                            transitive_closure)
from perturb.boxes.hierarchy.init import nested_boxes
from perturb.boxes.hierarchy.io import atomic_save, checkpoint_header, load_checkpoint
from perturb.boxes.hierarchy.model import BoxHierarchyModel, PairScores
from perturb.boxes.hierarchy.rng import resolve_generator, spawn_generator
from perturb.boxes.losses import PairSet, negative_nll, sample_negatives
from perturb.noise import Noise

__all__ = [
    "TrainHistory",
    "TrainResult",
    "Trainer",
    "train_hierarchy",
    "resolve_config",
    "initial_model",
    "training_pairs",
    "pair_losses",
    "stalled_pairs",
    "VOLUME_QUANTILES",
]

#: Quantile levels of the log-volume distribution recorded each epoch.
VOLUME_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: −log p of a hard (or Uniform-noise) positive pair with p = 0: finite, zero gradient.
HARD_LOG_FLOOR = -100.0
_ACCURACY_SAMPLE = 65536
_HALF = -math.log(2.0)
# per diagnostic step: zero entries, touched entries, stalled, violated, known negatives, pairs
_N_DIAG = 6


@dataclasses.dataclass
class TrainHistory:
    """What the trainers record.

    Per step: ``step_loss``. Per diagnostic step (the first step of each epoch and every
    ``diagnostics_every`` steps, :class:`HierarchyConfig`): ``diagnostic_steps`` (their global
    step numbers, from 0), ``zero_grad_fraction`` (of the gradient entries of the boxes in the
    batch, those with ``|g| <= grad_tol``), ``stalled_fraction`` (of the step's *violated*
    pairs, positives with p < 1/2 and negatives with p > 1/2, those whose own loss has a zero
    gradient with respect to both boxes; 0 when none is violated). Per epoch: ``loss`` (mean
    over steps), ``epoch_zero_grad_fraction``, ``epoch_stalled_fraction`` (stalled / violated
    pairs of its diagnostic steps), ``epoch_violated_fraction`` (violated / all pairs of its
    diagnostic steps), ``known_negatives`` (negatives of its diagnostic steps that were known
    pairs: 0 unless the sampler ran out of tries), ``volume_quantiles`` (``(epochs, 5)``
    log-volume quantiles at :data:`VOLUME_QUANTILES`, after the epoch),
    ``containment_accuracy`` (fraction of the training positives, up to 65,536 evenly spaced
    ones, with P(child ⊆ parent) ≥ ``accuracy_threshold``), ``eval`` (what ``eval_fn``
    returned, with its ``"epoch"``), ``seconds`` (wall-clock time of each epoch).
    """

    step_loss: list[float] = dataclasses.field(default_factory=list)
    diagnostic_steps: list[int] = dataclasses.field(default_factory=list)
    zero_grad_fraction: list[float] = dataclasses.field(default_factory=list)
    stalled_fraction: list[float] = dataclasses.field(default_factory=list)
    loss: list[float] = dataclasses.field(default_factory=list)
    epoch_zero_grad_fraction: list[float] = dataclasses.field(default_factory=list)
    epoch_stalled_fraction: list[float] = dataclasses.field(default_factory=list)
    epoch_violated_fraction: list[float] = dataclasses.field(default_factory=list)
    known_negatives: list[int] = dataclasses.field(default_factory=list)
    volume_quantiles: list[list[float]] = dataclasses.field(default_factory=list)
    containment_accuracy: list[float] = dataclasses.field(default_factory=list)
    eval: list[dict] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)


class TrainResult(NamedTuple):
    """``model`` (a :class:`BoxHierarchyModel`) and its :class:`TrainHistory`."""

    model: BoxHierarchyModel
    history: TrainHistory


# ----------------------------------------------------------------------------- set-up

def resolve_config(config: HierarchyConfig | None, dim: int | HierarchyConfig | None = None,
                   method: Any = None, **overrides: Any) -> HierarchyConfig:
    """``config`` (default ``HierarchyConfig()``) with ``dim``, ``method`` and ``overrides``
    replacing its fields (validated; TypeError for an unknown field). A config given in
    ``dim``'s place (``train_hierarchy(graph, config)``) is ``config``. ``method``, the third
    positional argument of the trainers, is the box model: a noise (or None given as
    ``noise=``), or a deprecated name of :data:`~perturb.boxes.hierarchy.config.METHODS`."""
    if isinstance(dim, HierarchyConfig) and config is None:    # train_hierarchy(graph, config)
        config, dim = dim, None
    if config is None:
        config = HierarchyConfig()
    elif not isinstance(config, HierarchyConfig):
        raise ValueError(f"config must be a HierarchyConfig, got {type(config).__name__}")
    if dim is not None:
        overrides["dim"] = dim
    if isinstance(method, Noise):
        overrides["noise"] = method
    elif method is not None:
        overrides["method"] = method
    return config.replace(**overrides) if overrides else config


def initial_model(num_nodes: int, nodes: list, config: HierarchyConfig,
                  positives: torch.Tensor, generator: torch.Generator,
                  device: torch.device | str | None = None) -> BoxHierarchyModel:
    """The model a run starts from: random boxes (``config.init``), then, with
    ``config.initializer == "nested"``, boxes nested along ``positives`` (the training edges;
    :func:`~perturb.boxes.hierarchy.nested_boxes`), both drawn from ``generator``."""
    model = BoxHierarchyModel(num_nodes, nodes=nodes, generator=generator, device=device,
                              **config.model_kwargs())
    if config.initializer == "nested":
        model.embedding.set_boxes(nested_boxes(num_nodes, positives.cpu(), config.dim,
                                               generator=generator))
    return model


def training_pairs(graph: nx.DiGraph, train_edges: Any = None, closure: bool = True
                   ) -> torch.Tensor:
    """The positive ``(m, 2)`` pairs of a run: ``train_edges`` (a tensor of node positions,
    checked, or an iterable of node-label pairs), else the transitive closure of ``graph``
    (``closure=True``) or its edges. Checks the graph (a DAG with >= 2 nodes) and that there is
    at least one pair."""
    check_hierarchy(graph)
    n = graph.number_of_nodes()
    if n < 2:
        raise ValueError(f"graph must have at least 2 nodes, got {n}")
    if train_edges is None:
        pos = edge_index(graph, (transitive_closure(graph) if closure else graph).edges)
    elif isinstance(train_edges, torch.Tensor):
        pos = check_pairs(train_edges, n, "train_edges")
    else:
        pos = edge_index(graph, train_edges)
    if pos.shape[0] == 0:
        raise ValueError("there are no training edges")
    return pos


def pair_losses(scores: PairScores, n_pos: int, method: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair losses: ``−log p`` of the first ``n_pos`` pairs (floored at 100 for the models
    whose p can be exactly 0: hard boxes and Uniform noise, whose corners cannot bridge a gap
    wider than its support) and ``−log(1 − p)`` of the others
    (:func:`~perturb.boxes.losses.negative_nll`).

    Shape:
        ``(n_pos,)`` and ``(P − n_pos,)``.
    """
    log_p = scores.log_p[:n_pos]
    if method in ("hard", "uniform"):
        log_p = log_p.clamp(min=HARD_LOG_FLOOR)          # p = 0: finite loss, zero gradient
    return -log_p, negative_nll(scores.log1m_p)


def stalled_pairs(model: BoxHierarchyModel, pairs: torch.Tensor, n_pos: int,
                  grad_tol: float = 1e-12, scores: PairScores | None = None, *,
                  validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(stalled, violated)`` counts (0-dim int64 tensors, not read back) of a batch of pairs
    whose first ``n_pos`` are positives.

    Violated: positives with p < 1/2, negatives with p > 1/2 (from ``scores`` when given).
    Stalled: violated pairs whose own loss term (:func:`pair_losses`) has a zero gradient,
    ``|g| <= grad_tol`` for every corner coordinate of both boxes: wrong, and nothing moves
    them (the local non-identifiability of Dasgupta et al.; disjoint or nested hard boxes have
    such pairs, Gumbel boxes none). One extra backward pass over the pairs, whose corners are
    detached per pair so that each gets its own gradient; parameter gradients are untouched.
    ``validate=False`` skips the NaN pass over the parameters (the trainer's steps).

    Shape:
        ``pairs``: ``(P, 2)`` ids on the model's device.
    """
    with torch.no_grad():
        if scores is None:
            scores = model.score_pairs(pairs[:, 0], pairs[:, 1], n_pos, validate=validate)
        violated = torch.cat([scores.log_p[:n_pos].detach() < _HALF,
                              scores.log1m_p.detach() < _HALF])
        box = model.gather(torch.cat([pairs[:, 0], pairs[:, 1]]), validate=validate)
    with torch.enable_grad():
        corners = [t.detach().requires_grad_() for t in (box.lower, box.upper)]
        # the gathered corners (checked), children first: the fused Gumbel score where it applies
        pos_terms, neg_terms = pair_losses(model._score_corners(corners[0], corners[1], n_pos),
                                           n_pos, model.method)
        # pairs are independent: the gradient of the sum holds each pair's own gradient
        grads = torch.autograd.grad(pos_terms.sum() + neg_terms.sum(), corners,
                                    allow_unused=True)
    size = torch.zeros(pairs.shape[0], dtype=corners[0].dtype, device=pairs.device)
    for g in grads:
        if g is not None:
            g = g.abs().amax(dim=-1)
            size = torch.maximum(size, torch.maximum(g[:pairs.shape[0]], g[pairs.shape[0]:]))
    return (violated & (size <= grad_tol)).sum(), violated.sum()


def _adam(model: BoxHierarchyModel, lr: float) -> torch.optim.Optimizer:
    """Adam; the fused implementation (one kernel over all parameters) where available; the
    lazy Adam of sparse row gradients when the model's gathers give them."""
    if model.sparse_grad:
        return LazyAdam(model.parameters(), lr=lr)
    try:
        return torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.Adam(model.parameters(), lr=lr)


#: Steps between two clean-ups of the Adam moments (:func:`zero_tiny_moments`).
MOMENT_CLEANUP_EVERY = 64


def zero_tiny_moments(optimizer: torch.optim.Optimizer) -> None:
    """Set to 0 the Adam moments below ``2**24 · finfo.tiny`` (2e-31 in float32), in place, on
    the device (no host read).

    With ``optimizer="sparse_adam"`` (:class:`~perturb.boxes.hierarchy._lazy_adam.LazyAdam`,
    the same state keys) it is kept, although it rarely finds anything: lazy moments decay only
    when their box is touched, so they do not drift into denormals; what it still catches is
    the moments of tiny gradients, at the cost of one pass over the moments every 64 steps.

    Why: the dense Adam update decays the moments of every box a step does not touch (the
    first by 0.9 per step), so after a few epochs most of the first moments of a large
    hierarchy are denormal floats, and CPU arithmetic on denormals is many times slower (a
    WordNet epoch grew from 1.5 s to 2.5 s over 16 epochs). Called every
    :data:`MOMENT_CLEANUP_EVERY` steps, it keeps every moment normal (0.9**64 > 2**-24). It
    changes no update measurably: a first moment below 2e-31 moves a parameter by less than
    lr · 2e-31 / eps = lr · 2e-23, and a second moment below it changes the denominator
    sqrt(v) + eps by less than 1e-15 · eps.
    """
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state.get(key)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.masked_fill_(t.abs() < torch.finfo(t.dtype).tiny * 2 ** 24, 0.0)


def _volume_quantiles(log_vol: torch.Tensor) -> list[float]:
    """The log volumes' quantiles at :data:`VOLUME_QUANTILES` as ``torch.quantile`` of their
    float64 copy gives them (linear interpolation; −inf, an empty hard box, read as −1e300),
    from one sort in their own dtype (the conversion to float64 is exact and keeps the order):
    several times cheaper than ``torch.quantile``'s float64 sort and its extra passes."""
    s = log_vol.detach().sort().values.cpu().double().clamp(min=-1e300)
    at = torch.tensor(VOLUME_QUANTILES, dtype=torch.float64) * (s.numel() - 1)
    lo, hi = at.floor().long(), at.ceil().long()
    return torch.lerp(s[lo], s[hi], at - lo.double()).tolist()


def _log_p_given_volumes(model: BoxHierarchyModel, pairs: torch.Tensor,
                         log_vol: torch.Tensor) -> torch.Tensor:
    """log P(child ⊆ parent) of ``(m, 2)`` pairs (ids checked) given every box's log volume
    ``log_vol``: the children's are read from it, so only the intersections' volumes are
    computed (:meth:`~BoxHierarchyModel.score_boxes`; half the work of
    :func:`~perturb.boxes.hierarchy.score_pairs` at the end of an epoch, whose volumes are
    computed anyway for their quantiles). No gradient wanted (the caller's ``no_grad``)."""
    m = pairs.shape[0]
    box = model.gather(torch.cat([pairs[:, 0], pairs[:, 1]]), validate=False)
    (lo_c, lo_p), (hi_c, hi_p) = box.lower.split(m), box.upper.split(m)
    return model.score_boxes(Box._trusted(lo_p, hi_p), Box._trusted(lo_c, hi_c), m,
                             log_vol[pairs[:, 0].to(log_vol.device)]).log_p


# ----------------------------------------------------------------------------- the loop

class Trainer:
    """The state of a training run and its epoch loop, shared by :func:`train_hierarchy` and
    the distributed trainer.

    Args:
        model: the boxes (their device is the training device).
        positives: ``(m, 2)`` positive pairs (moved to the device).
        known: pairs never drawn as negatives (self pairs included), a PairSet.
        config: the run's :class:`HierarchyConfig`.
        generator: generator on the training device for shuffling and negatives.
        scorer: ``scorer(child, parent, n_pos, validate=False) -> PairScores`` (default
            ``model.score_pairs``; the distributed trainer passes its DDP wrapper).
        steps_per_epoch: None: batches of ``batch_size`` (the last may be smaller); an int:
            that many nearly equal batches (every DDP rank must take the same number).
        reduce: ``reduce(t) -> t`` applied to the epoch's metric tensor before it is read
            (the distributed trainer averages it over the ranks).

    ``state_dict()`` / ``load_state_dict()`` hold the model, the optimizer, the generator, the
    epoch, the step counter and the history: everything a resumed run needs to continue
    bit for bit. The optimizer is ``config.optimizer``'s: dense Adam, or with "sparse_adam" the
    lazy Adam, for which the trainer sets ``model.sparse_grad`` (sparse row gradients).
    """

    def __init__(self, model: BoxHierarchyModel, positives: torch.Tensor, known: PairSet,
                 config: HierarchyConfig, generator: torch.Generator, *,
                 scorer: Callable[..., PairScores] | None = None,
                 steps_per_epoch: int | None = None,
                 reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model, self.config, self.generator = model, config, generator
        dev = model.device
        self.positives = positives.to(dev)
        self.known = known.to(dev)
        self.scorer = scorer if scorer is not None else model.score_pairs
        self.steps_per_epoch = steps_per_epoch
        self.reduce = reduce
        # the lazy Adam updates the rows of sparse gradients: the model's gathers give them
        model.sparse_grad = config.optimizer == "sparse_adam"
        self.optimizer = _adam(model, config.lr)
        self.epoch = 0
        self.step_count = 0
        self.history = TrainHistory()
        m = self.positives.shape[0]
        at = torch.linspace(0, m - 1, min(m, _ACCURACY_SAMPLE), device=dev).long()
        self._accuracy_sample = self.positives[at]

    # -------------------------------------------------------------- one step
    def step(self, batch: torch.Tensor, diagnostics: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimiser step on ``batch`` (``(m, 2)`` positives on the device) and its fresh
        negatives. Returns the loss (a 0-dim tensor, not read) and, when ``diagnostics``, the
        step's diagnostic counts (a float64 tensor, not read). No host read of its own, and
        no NaN pass over the parameters (``validate=False`` to the model: the positives were
        checked once, up front)."""
        cfg, model = self.config, self.model
        m = batch.shape[0]
        if cfg.negatives_per_positive:
            neg = sample_negatives(batch, model.num_nodes, cfg.negatives_per_positive,
                                   known=self.known, generator=self.generator,
                                   max_tries=cfg.negative_max_tries, strict=False,
                                   mode=cfg.sampler)
            pairs = torch.cat([batch, neg.reshape(-1, 2)])
        else:
            pairs = batch
        scores = self.scorer(pairs[:, 0], pairs[:, 1], m, validate=False)
        pos_terms, neg_terms = pair_losses(scores, m, model.method)
        loss = pos_terms.mean()
        if neg_terms.numel():
            loss = loss + cfg.negative_weight * neg_terms.mean()
        if cfg.volume_reg > 0:
            loss = loss + cfg.volume_reg * self._volume_penalty(pairs)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats = self._diagnostics(pairs, scores, m) if diagnostics else None
        self.optimizer.step()
        if (self.step_count + 1) % MOMENT_CLEANUP_EVERY == 0:
            zero_tiny_moments(self.optimizer)
        return loss.detach(), stats

    def _volume_penalty(self, pairs: torch.Tensor) -> torch.Tensor:
        """Σ over the distinct boxes of ``pairs`` of 1[Vol > τ_v]·Vol, without finding the
        distinct ids (each occurrence is weighted by 1/count)."""
        ids = pairs.reshape(-1)
        vol = torch.exp(self.model.log_volume(ids, validate=False))
        counts = torch.zeros(self.model.num_nodes, dtype=vol.dtype, device=vol.device)
        counts.index_add_(0, ids, torch.ones_like(vol))
        pen = torch.where(vol > self.config.volume_threshold, vol, torch.zeros_like(vol))
        return (pen / counts[ids]).sum()

    def _diagnostics(self, pairs: torch.Tensor, scores: PairScores, m: int) -> torch.Tensor:
        """The counts behind the zero-gradient and stalled-pair fractions (module docstring):
        a float64 tensor of :data:`_N_DIAG` entries, left on the device."""
        model, tol = self.model, self.config.grad_tol
        with torch.no_grad():
            touched = torch.zeros(model.num_nodes, dtype=torch.bool, device=pairs.device)
            touched[pairs.reshape(-1)] = True
            zero = torch.zeros((), dtype=torch.float64, device=pairs.device)
            for p in (model.embedding.param1, model.embedding.param2):
                if p.grad is not None:
                    g = p.grad.to_dense() if p.grad.is_sparse else p.grad   # repeats summed
                    zero += ((g.abs() <= tol) & touched.unsqueeze(1)).sum()
            n_touched = touched.sum() * (2 * model.dim)
            known = self.known.contains(pairs[m:]).sum()
        stalled, violated = stalled_pairs(model, pairs, m, tol, scores, validate=False)
        return torch.stack([t.double() for t in (
            zero, n_touched, stalled, violated, known,
            torch.full((), pairs.shape[0], device=pairs.device))])

    # -------------------------------------------------------------- one epoch
    def run_epoch(self, eval_fn: Callable[[BoxHierarchyModel], dict] | None = None) -> None:
        """Train one epoch and append its record to ``history`` (one host read of the
        step metrics, at the end)."""
        t0 = time.perf_counter()
        cfg, model = self.config, self.model
        dev = model.device
        model.train()
        m = self.positives.shape[0]
        perm = torch.randperm(m, generator=self.generator, device=self.generator.device).to(dev)
        batches = (perm.split(cfg.batch_size) if self.steps_per_epoch is None
                   else torch.tensor_split(perm, self.steps_per_epoch))
        losses = torch.zeros(len(batches), dtype=torch.float64, device=dev)
        diag, diag_steps = [], []
        every = cfg.diagnostics_every
        for s, idx in enumerate(batches):        # the steps skip the value checks (step())
            loss, stats = self.step(self.positives[idx], bool(every) and s % every == 0)
            losses[s] = loss
            if stats is not None:
                diag.append(stats)
                diag_steps.append(self.step_count)
            self.step_count += 1
        flat = torch.cat([losses, *diag])
        if self.reduce is not None:
            flat = self.reduce(flat)
        values = flat.tolist()                        # the epoch's one host read
        self._record(values[:len(batches)], values[len(batches):], diag_steps)
        model.eval()
        with torch.no_grad():
            log_vol = model.log_volume()                  # every box once (NaN-checked)
            self.history.volume_quantiles.append(_volume_quantiles(log_vol))
            lp = _log_p_given_volumes(model, self._accuracy_sample, log_vol)
            acc = (lp >= math.log(cfg.accuracy_threshold)).double().mean()
            self.history.containment_accuracy.append(float(acc))
            if eval_fn is not None and cfg.eval_every and (
                    (self.epoch + 1) % cfg.eval_every == 0 or self.epoch + 1 == cfg.epochs):
                self.history.eval.append({"epoch": self.epoch + 1, **eval_fn(model)})
        self.history.seconds.append(time.perf_counter() - t0)
        self.epoch += 1

    def _record(self, losses: list[float], diag: list[float], steps: list[int]) -> None:
        h = self.history
        h.step_loss.extend(losses)
        h.loss.append(sum(losses) / max(1, len(losses)))
        rows = [diag[i:i + _N_DIAG] for i in range(0, len(diag), _N_DIAG)]
        h.diagnostic_steps.extend(steps)
        h.zero_grad_fraction.extend(r[0] / r[1] if r[1] else 0.0 for r in rows)
        h.stalled_fraction.extend(r[2] / r[3] if r[3] else 0.0 for r in rows)
        tot = [sum(r[i] for r in rows) for i in range(_N_DIAG)]
        h.epoch_zero_grad_fraction.append(tot[0] / tot[1] if tot[1] else 0.0)
        h.epoch_stalled_fraction.append(tot[2] / tot[3] if tot[3] else 0.0)
        h.epoch_violated_fraction.append(tot[3] / tot[5] if tot[5] else 0.0)
        h.known_negatives.append(int(round(tot[4])))

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, generator state, epoch, step counter and history (CPU tensors
        and plain Python values)."""
        return {"model": self.model.cpu_state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(),
                "epoch": self.epoch, "step": self.step_count,
                "history": dataclasses.asdict(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.epoch, self.step_count = int(state["epoch"]), int(state["step"])
        self.history = TrainHistory(**state["history"])


# ----------------------------------------------------------------------------- entry point

def _progress(iterable: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:                      # tqdm is an optional dependency
        return iterable
    return tqdm(iterable, desc=desc, leave=False)


def train_hierarchy(graph: nx.DiGraph, dim: int | HierarchyConfig | None = None,
                    method: Noise | str | None = None, *,
                    config: HierarchyConfig | None = None, train_edges: Any = None,
                    known_edges: torch.Tensor | None = None,
                    generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, progress: bool = True,
                    eval_fn: Callable[[BoxHierarchyModel], dict] | None = None,
                    model: BoxHierarchyModel | None = None,
                    checkpoint: str | os.PathLike | None = None, resume: bool = False,
                    on_epoch_end: Callable[[int, "Trainer"], None] | None = None,
                    **overrides: Any) -> TrainResult:
    """Fit boxes so that ``child ⊆ parent`` for the edges of a hierarchy (module docstring).

    Args:
        graph: ``networkx.DiGraph``, edges ``child -> parent``, acyclic. Box ``i`` belongs to
            ``list(graph.nodes)[i]``.
        dim, method: shortcuts: ``dim`` the config field (or the whole config:
            ``train_hierarchy(graph, config)``), ``method`` the box model, a noise
            (the config's ``noise``; ``noise=None`` by keyword) or a deprecated name ("gumbel",
            "soft", …; FutureWarning).
        config: the hyper-parameters (:class:`HierarchyConfig`, default ``HierarchyConfig()``);
            its fields may also be given as keyword arguments (``epochs=20, seed=0``), which
            replace those of ``config``.
        train_edges: the positive ``(child, parent)`` pairs, as an ``(m, 2)`` tensor of node
            positions or an iterable of node-label pairs; default: the transitive closure of
            ``graph`` (``config.closure``) or its edges.
        known_edges: ``(m, 2)`` pairs never drawn as negatives (default: the training
            positives; self pairs are always excluded). For the generalisation protocol pass
            the closure of the training edges (``BenchmarkSplit.closure``).
        generator: randomness of initialisation, shuffling and negatives (instead of
            ``config.seed``). Shuffling and negatives are drawn on ``device`` from a generator
            seeded by it.
        device: where to train (default CPU).
        progress: show a tqdm bar over epochs (when tqdm is installed).
        eval_fn: called as ``eval_fn(model)`` (eval mode, no grad) every ``config.eval_every``
            epochs and after the last; its dicts (of plain numbers, so that checkpoints hold
            them) go to ``history.eval``.
        model: continue training this model instead of creating one (its box model and
            initial boxes are used; the config's model fields are then ignored).
        checkpoint: path of a checkpoint file written (atomically) every
            ``config.checkpoint_every`` epochs and after the last.
        resume: continue from ``checkpoint`` when it exists (same config up to ``epochs``,
            ``checkpoint_every`` and ``eval_every``; same graph and training pairs): the
            resumed run ends with the same parameters, bit for bit on the CPU, as one that was
            never interrupted. Without the file, training starts from scratch.
        on_epoch_end: called as ``on_epoch_end(epoch, trainer)`` after each epoch (and its
            checkpoint), ``epoch`` counting from 1.

    Returns:
        :class:`TrainResult` ``(model, history)``.

    Raises:
        ValueError: a cyclic or non-DiGraph ``graph``, bad hyper-parameters (naming the
            field), edges whose endpoints are not nodes, a model of the wrong size, a
            checkpoint of another run, ``resume=True`` without ``checkpoint``.
        TypeError: an unknown keyword argument.

    Example:
        >>> from perturb.boxes.hierarchy import balanced_tree
        >>> res = train_hierarchy(balanced_tree(2, 3), dim=2, epochs=5, seed=0, progress=False)
        >>> len(res.history.loss)
        5
    """
    cfg = resolve_config(config, dim, method, **overrides)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    pos = training_pairs(graph, train_edges, cfg.closure)
    n = graph.number_of_nodes()
    host = resolve_generator(generator, cfg.seed)
    if model is None:
        model = initial_model(n, list(graph.nodes), cfg, pos, host, device)
    elif model.num_nodes != n or model.dim != cfg.dim:
        raise ValueError(f"model has {model.num_nodes} boxes of dim {model.dim}, the graph "
                         f"needs {n} of dim {cfg.dim}")
    known = PairSet(pos if known_edges is None else check_pairs(known_edges, n, "known_edges"),
                    n, include_self=True, device=model.device)
    trainer = Trainer(model, pos, known, cfg, spawn_generator(host, model.device))
    header = checkpoint_header(cfg, pos, n) if checkpoint is not None else None
    if resume and checkpoint is not None and os.path.exists(checkpoint):
        state = load_checkpoint(checkpoint, header)
        trainer.load_state_dict(state["trainer"])
        host.set_state(state["host_generator"])
    bar = _progress(range(trainer.epoch, cfg.epochs), progress, f"{model.method} d={model.dim}")
    for _ in bar:
        trainer.run_epoch(eval_fn)
        if header is not None and checkpoint is not None and (trainer.epoch % cfg.checkpoint_every == 0
                                   or trainer.epoch == cfg.epochs):
            atomic_save({**header, "trainer": trainer.state_dict(),
                         "host_generator": host.get_state()}, checkpoint)
        if hasattr(bar, "set_postfix"):
            h = trainer.history
            bar.set_postfix(loss=f"{h.loss[-1]:.4f}", stalled=f"{h.epoch_stalled_fraction[-1]:.2f}")
        if on_epoch_end is not None:
            on_epoch_end(trainer.epoch, trainer)
    model.eval()
    model.sparse_grad = False                # the returned model: dense gradients again
    return TrainResult(model, trainer.history)
