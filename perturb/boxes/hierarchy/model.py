"""``BoxHierarchyModel``: one box per node of a hierarchy, and how pairs of them are scored.

A pair ``(child, parent)`` is scored by

    log P(child ⊆ parent) = log E[Vol(parent ∩ child)] − log E[Vol(child)]   (clamped at 0)

(:func:`~perturb.boxes.log_containment_prob`) under one of three box models: Gumbel boxes
(Gumbel intersection with scale β, expected volumes with scale β_vol), soft boxes (hard
intersection, softplus volumes) or hard boxes. Training also needs log(1 − P) of its negative
pairs, accurate where a Gumbel child lies deep inside its parent and P rounds to 1
(:func:`~perturb.boxes.log1m_containment_prob`); :meth:`BoxHierarchyModel.score_pairs`
computes both for a batch in one pass (one embedding lookup, one volume evaluation).
"""
from __future__ import annotations

from typing import Any, Hashable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from perturb._validation import check_int, check_tau
from perturb.boxes._gumbel_pairs import gumbel_pair_scores
from perturb.boxes.box import Box
from perturb.boxes.embedding import BoxEmbedding
# TODO(intersections.py owner): export this as a public name (log(1 − P) given log P); it is
# the only private name the hierarchy application still imports.
from perturb.boxes.expected_volumes import expected_volume, volume
from perturb.boxes.intersections import (_log1m_containment, intersection,
                                         log1m_containment_prob, log_containment_prob)
from perturb.boxes.hierarchy._gather import gather_rows
from perturb.boxes.hierarchy.config import DEFAULT_NOISE, box_model, resolve_box_model
from perturb.boxes.noise_records import noise_record
from perturb.noise import Gumbel, Noise

__all__ = ["BoxHierarchyModel", "PairScores", "check_model"]

# dtypes of the fused Gumbel pair score (half types take the general, upcasting path)
_FUSED_DTYPES = (torch.float32, torch.float64)


class PairScores(NamedTuple):
    """Scores of a batch of pairs whose first ``n_pos`` are positives: ``log_p`` (all pairs,
    log P(child ⊆ parent)) and ``log1m_p`` (the other pairs only, accurate log(1 − P))."""

    log_p: torch.Tensor
    log1m_p: torch.Tensor


def _split_pairs(lower: torch.Tensor, upper: torch.Tensor) -> tuple[Box, Box]:
    """The children and the parents of corners ``(2P, d)`` (children first). By split, not
    two slices: its backward is one cat, where each slice's backward fills a zero tensor of
    the full size and the two are then added."""
    n = lower.shape[0] // 2
    (lo_c, lo_p), (hi_c, hi_p) = lower.split(n), upper.split(n)
    return Box._trusted(lo_c, hi_c), Box._trusted(lo_p, hi_p)


class BoxHierarchyModel(nn.Module):
    """Boxes for the nodes of a hierarchy, with the box model used to score pairs.

    Wraps a :class:`~perturb.boxes.BoxEmbedding` (its own noise unused) and fixes how
    containment is computed, from the noise perturbing every corner (lower ``+ε``, upper
    ``−ε'``): ``noise=Gumbel(scale=β)`` (Gumbel intersection with scale β, expected volumes with
    scale ``volume_beta``, None: β; the closed forms), any other noise on the line
    (``Normal(σ)``, ``Logistic(s)``: containment the ratio of expected volumes,
    :func:`~perturb.boxes.expected_volume`: by quadrature for Normal noise, about 10–100× the
    cost of the Gumbel closed form; in closed form for Logistic noise, a few times it;
    bench/RESULTS.md), or ``noise=None``: hard boxes, or soft boxes (hard
    intersection, softplus volumes: a smoothing, not a noise) with ``temperature``.

    Args:
        num_nodes, dim: number of boxes and their dimension.
        noise: the corner noise (default ``Gumbel(scale=0.01)``), or None.
        volume_beta: Gumbel noise only: the scale of the expected volumes.
        temperature: ``noise=None`` only: the softplus temperature of soft boxes.
        method, beta: deprecated (FutureWarning): "gumbel", "normal", "logistic" (that noise
            with scale ``beta``), "soft" or "hard"; ``beta`` alone: the noise's scale.
        nodes: the node labels, ``nodes[i]`` owning box ``i`` (default ``range(num_nodes)``).
        parameterisation, init, generator, dtype, device: passed to ``BoxEmbedding``.

    Shape:
        :meth:`log_containment`: ids ``(*batch,)`` -> ``(*batch,)``; :meth:`score_pairs`:
        ids ``(P,)`` -> :class:`PairScores` of shapes ``(P,)`` and ``(P − n_pos,)``. Results are
        on the device and in the dtype of the parameters.

    Example:
        >>> m = BoxHierarchyModel(5, 2, nodes=list("abcde"))
        >>> m.log_containment(m.ids(["b"]), m.ids(["a"])).shape
        torch.Size([1])
    """

    def __init__(self, num_nodes: int, dim: int, noise: Noise | None = DEFAULT_NOISE, *,
                 volume_beta: float | None = 0.1, temperature: float | None = None,
                 method: str | None = None, beta: float | None = None,
                 nodes: Sequence[Hashable] | None = None, parameterisation: str = "center_offset",
                 init: float | Sequence[float] = (0.1, 0.5),
                 generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_int(num_nodes, "num_nodes", low=1)
        self.noise, self.temperature = resolve_box_model(
            "BoxHierarchyModel", noise, temperature, method, beta)
        if volume_beta is not None:
            check_tau(volume_beta, "volume_beta")
        self.volume_beta = float(volume_beta) if volume_beta is not None else None
        self.embedding = BoxEmbedding(num_nodes, dim, beta=None, parameterisation=parameterisation,
                                      init=init, generator=generator, dtype=dtype, device=device)
        self.nodes = list(nodes) if nodes is not None else list(range(num_nodes))
        if len(self.nodes) != num_nodes:
            raise ValueError(f"nodes must have num_nodes={num_nodes} labels, got {len(self.nodes)}")
        self._index: dict[Hashable, int] | None = None
        #: Whether the row gathers (:meth:`gather`, and :meth:`log_volume` of all boxes while
        #: gradients are recorded) give sparse COO gradients of the corner tables instead of
        #: dense ones, for a lazy optimizer (``HierarchyConfig.optimizer="sparse_adam"``; the
        #: trainer sets it). :meth:`forward` then gathers too; ``embedding`` itself does not.
        self.sparse_grad = False

    @property
    def num_nodes(self) -> int:
        return self.embedding.num_entities

    @property
    def dim(self) -> int:
        return self.embedding.dim

    @property
    def device(self) -> torch.device:
        return self.embedding.param1.device

    @property
    def method(self) -> str:
        """The box model's name, one of "gumbel", "normal", "logistic", …, "soft" or "hard"."""
        return box_model(self.noise, self.temperature)

    @property
    def beta(self) -> float | None:
        """The noise's scale (None without noise, or for a noise without one)."""
        scale = getattr(self.noise, "scale", None)      # Uniform has low and high instead
        return None if scale is None else float(scale)

    def hparams(self) -> dict[str, Any]:
        """The constructor arguments (besides ``nodes``, ``generator``, ``device``), plain
        values (the noise as ``perturb.boxes.noise_records.noise_record``)."""
        return dict(num_nodes=self.num_nodes, dim=self.dim, noise=noise_record(self.noise),
                    volume_beta=self.volume_beta, temperature=self.temperature,
                    parameterisation=self.embedding.parameterisation,
                    init=tuple(self.embedding.init), dtype=self.embedding.param1.dtype)

    def cpu_state_dict(self) -> dict[str, Any]:
        """``state_dict()`` with its tensors detached and on the CPU; the embedding's
        ``_extra_state`` (its parameterisation, sizes and β, plain values) as it is."""
        return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                for k, v in self.state_dict().items()}

    def ids(self, labels: Sequence[Hashable]) -> torch.Tensor:
        """Box ids of node labels, as a LongTensor on the model's device (KeyError-free:
        ValueError naming the unknown label)."""
        if self._index is None:
            self._index = {u: i for i, u in enumerate(self.nodes)}
        try:
            rows = [self._index[u] for u in labels]
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} is not a node of this model") from None
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def forward(self, ids: torch.Tensor) -> Box:
        """The boxes of ``ids`` (``(*batch,)`` -> ``(*batch, dim)``; ids checked). With
        :attr:`sparse_grad`, by :meth:`gather` (sparse gradients)."""
        if not self.sparse_grad:
            return self.embedding(ids)
        self.embedding._check_ids(ids)
        box = self.gather(ids.reshape(-1))
        shape = (*ids.shape, self.dim)
        return Box._trusted(box.lower.reshape(shape), box.upper.reshape(shape))

    def gather(self, ids: torch.Tensor, *, validate: bool = True) -> Box:
        """The boxes of ``ids`` (``(k,)`` integer, not range-checked: the trainer checks its
        pairs once) by a row gather of the parameters: the same boxes as :meth:`forward`,
        whose ``F.embedding`` backward builds the dense ``(num_nodes, dim)`` gradient about 3×
        slower on the CPU; the gather's backward is ``index_put_``, 1.4–1.6× faster than
        ``index_select``'s (:mod:`perturb.boxes.hierarchy._gather`). ``validate=False`` skips
        the NaN pass over the parameters that runs while perturb's validation is on (the
        trainer's steps). With :attr:`sparse_grad` the backward gives sparse COO gradients."""
        e = self.embedding
        ids = ids.to(device=e.param1.device, dtype=torch.long)
        sparse = self.sparse_grad
        return e._make_box(gather_rows(e.param1, ids, sparse), gather_rows(e.param2, ids, sparse),
                           validate)

    @property
    def _gumbel_beta(self) -> float | None:
        """β of Gumbel noise (the closed forms), else None."""
        return float(self.noise.scale) if type(self.noise) is Gumbel else None

    @property
    def _quadrature_noise(self) -> Noise | None:
        """A noise other than Gumbel (expected volumes by quadrature), else None."""
        return None if self.noise is None or type(self.noise) is Gumbel else self.noise

    def _box_kwargs(self) -> dict[str, Any]:
        beta = self._gumbel_beta
        if beta is not None:
            return {"beta": beta, "volume_beta": self.volume_beta}
        if self.noise is not None:
            return {"noise": self.noise}
        if self.temperature is not None:
            return {"temperature": self.temperature}
        return {}

    def log_containment_boxes(self, parent: Box, child: Box) -> torch.Tensor:
        """log P(child ⊆ parent) for given boxes under this model's box model."""
        return log_containment_prob(parent, child, **self._box_kwargs())

    def log_containment(self, child: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
        """log P(child ⊆ parent) for node ids (child first, as in the edges
        ``child -> parent``); same value as :meth:`log_containment_boxes`."""
        shape = torch.broadcast_shapes(child.shape, parent.shape)
        child, parent = child.expand(shape).reshape(-1), parent.expand(shape).reshape(-1)
        return self.score_pairs(child, parent, child.numel()).log_p.reshape(shape)

    def log_containment_pair(self, child: torch.Tensor, parent: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P, log(1 − P))`` of ``child ⊆ parent`` for node ids; the second is accurate
        for Gumbel children deep inside their parents, where P rounds to 1
        (:func:`~perturb.boxes.log1m_containment_prob`)."""
        shape = torch.broadcast_shapes(child.shape, parent.shape)
        child, parent = child.expand(shape).reshape(-1), parent.expand(shape).reshape(-1)
        log_p, log1m = self.score_pairs(child, parent, 0)
        return log_p.reshape(shape), log1m.reshape(shape)

    def score_pairs(self, child: torch.Tensor, parent: torch.Tensor, n_pos: int = 0, *,
                    validate: bool = True) -> PairScores:
        """Scores of the pairs ``(child[i], parent[i])`` whose first ``n_pos`` are positives:
        log P for all, log(1 − P) for the others (what the training loss needs).

        One embedding lookup for both ends. The child volumes are computed once per node when
        there are at least as many pairs as nodes, otherwise per pair, in the same call as the
        intersection volumes. No host synchronisation of its own. ``validate=False`` skips the
        NaN pass over the parameters (:meth:`gather`).
        """
        n_pairs = child.shape[0]
        box = self.gather(torch.cat([child, parent]), validate=validate)
        if n_pairs < self.num_nodes:
            return self._score_corners(box.lower, box.upper, n_pos)
        cb, pb = _split_pairs(box.lower, box.upper)
        log_child = self.log_volume(validate=validate)[child.to(self.device)]
        return self.score_boxes(pb, cb, n_pos, log_child)

    def _score_corners(self, lower: torch.Tensor, upper: torch.Tensor, n_pos: int = 0
                       ) -> PairScores:
        """:meth:`score_boxes` of the boxes ``[lower, upper]`` (``(2P, d)``: the P children,
        then their P parents; finite), for Gumbel boxes by the fused pair score (log P in one
        autograd node, :mod:`perturb.boxes._gumbel_pairs`; the same values and gradients to
        rounding). :meth:`score_pairs` and the trainer's stalled-pair diagnostic."""
        beta = self._gumbel_beta
        if beta is not None and lower.dtype in _FUSED_DTYPES:
            return PairScores(*gumbel_pair_scores(lower, upper, n_pos, beta,
                                                  self.volume_beta or beta))
        cb, pb = _split_pairs(lower, upper)
        return self.score_boxes(pb, cb, n_pos)

    def score_boxes(self, parent: Box, child: Box, n_pos: int = 0,
                    log_child: torch.Tensor | None = None) -> PairScores:
        """:meth:`score_pairs` for given boxes ``(P, d)``; ``log_child``: the children's log
        volumes when known (else computed with the intersection volumes, in one call)."""
        noise = self._quadrature_noise
        if noise is not None:          # quadrature boxes: the core functions
            if log_child is None:
                log_p = log_containment_prob(parent, child, noise=noise)
            else:                      # the children's volumes, computed once per node
                log_inter = expected_volume(parent, child, noise=noise, log=True)
                # a child of expected volume exactly 0 (bounded noise) is contained: P = 1
                log_p = torch.where(torch.isneginf(log_child), 0.0,
                                    log_inter - log_child).clamp(max=0.0)
            return PairScores(log_p, log1m_containment_prob(parent[n_pos:], child[n_pos:],
                                                            noise=noise))
        beta = self._gumbel_beta
        inter = intersection(parent, child, beta)
        if log_child is None:
            # corners of checked boxes and their intersection: no second NaN pass
            both = self._log_volume_box(Box._trusted(torch.cat([inter.lower, child.lower]),
                                                     torch.cat([inter.upper, child.upper])))
            log_inter, log_child = both.split(child.lower.shape[0])
        else:
            log_inter = self._log_volume_box(inter)
        log_p = log_inter - log_child
        if beta is None and self.temperature is None:   # an empty hard child: in anything
            log_p = torch.where(torch.isneginf(log_child), torch.zeros_like(log_p), log_p)
        log_p = log_p.clamp(max=0.0)
        log1m = _log1m_containment(log_p[n_pos:], parent[n_pos:], child[n_pos:], beta,
                                   None if beta is None else (self.volume_beta or beta), False)
        return PairScores(log_p, log1m)

    def log_volume(self, ids: torch.Tensor | None = None, *, validate: bool = True
                   ) -> torch.Tensor:
        """Log (expected) volume of the boxes of ``ids`` (all boxes when None).
        ``validate=False``: ``ids`` were checked by the caller, and the value checks (ids in
        range, no NaN parameter) are skipped."""
        if ids is None:
            if self.sparse_grad and torch.is_grad_enabled():    # sparse gradients: a gather
                ids = torch.arange(self.num_nodes, device=self.device)
                return self._log_volume_box(self.gather(ids, validate=validate))
            return self._log_volume_box(self.embedding._all_boxes(validate))
        return self._log_volume_box(self(ids) if validate else self.gather(ids, validate=False))

    def _log_volume_box(self, box: Box) -> torch.Tensor:
        noise = self._quadrature_noise
        if noise is not None:
            return expected_volume(box, noise=noise, log=True)
        beta = self._gumbel_beta
        if beta is not None:
            return volume(box, beta=self.volume_beta or beta, log=True)
        return volume(box, temperature=self.temperature, log=True)

    def extra_repr(self) -> str:
        if self.noise is None:
            model = f"noise=None, temperature={self.temperature}"
        else:
            model = f"noise={self.noise!r}" + (f", volume_beta={self.volume_beta}"
                                               if self._gumbel_beta is not None else "")
        return f"num_nodes={self.num_nodes}, dim={self.dim}, {model}"


def check_model(model: object) -> None:
    """ValueError unless ``model`` is a :class:`BoxHierarchyModel`."""
    if not isinstance(model, BoxHierarchyModel):
        raise ValueError(f"model must be a BoxHierarchyModel, got {type(model).__name__}")
