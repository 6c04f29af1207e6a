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

from typing import Any, Callable, Hashable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from perturb._validation import check_choice, check_int, check_tau
from perturb.boxes.box import Box
from perturb.boxes.embedding import BoxEmbedding
# TODO(intersections.py owner): export this as a public name (log(1 − P) given log P); it is
# the only private name the hierarchy application still imports.
from perturb.boxes.expected_volumes import expected_volume, volume
from perturb.boxes.intersections import (_log1m_containment, intersection,
                                         log1m_containment_prob, log_containment_prob)
from perturb.boxes.hierarchy.config import METHODS
from perturb.noise import Logistic, Noise, Normal

#: The box models whose corners are perturbed by a noise of scale ``beta`` (expected volumes
#: by quadrature, :func:`~perturb.boxes.expected_volume`).
_NOISES: dict[str, Callable[[float], Noise]] = {"normal": Normal, "logistic": Logistic}

__all__ = ["BoxHierarchyModel", "PairScores", "check_model"]


class PairScores(NamedTuple):
    """Scores of a batch of pairs whose first ``n_pos`` are positives: ``log_p`` (all pairs,
    log P(child ⊆ parent)) and ``log1m_p`` (the other pairs only, accurate log(1 − P))."""

    log_p: torch.Tensor
    log1m_p: torch.Tensor


class BoxHierarchyModel(nn.Module):
    """Boxes for the nodes of a hierarchy, with the box model used to score pairs.

    Wraps a :class:`~perturb.boxes.BoxEmbedding` (its own ``beta`` unused) and fixes how
    containment is computed: ``method="gumbel"`` (Gumbel intersection with scale ``beta``,
    expected volumes with scale ``volume_beta``; ``volume_beta=None`` uses ``beta``), ``"soft"``
    (hard intersection, softplus volumes with ``temperature``), ``"hard"``, or ``"normal"`` /
    ``"logistic"``: every corner perturbed by that noise with scale ``beta`` (lower ``+ε``,
    upper ``−ε'``), containment the ratio of expected volumes
    (:func:`~perturb.boxes.expected_volume`, by quadrature: about 10–100× the cost of the
    Gumbel closed form, bench/RESULTS.md).

    Args:
        num_nodes, dim: number of boxes and their dimension.
        method: "gumbel", "soft", "hard", "normal" or "logistic".
        beta, volume_beta: Gumbel scales (``method="gumbel"`` only); ``beta`` is the noise
            scale of "normal" and "logistic".
        temperature: softplus temperature (``method="soft"`` only).
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

    def __init__(self, num_nodes: int, dim: int, method: str = "gumbel", *,
                 beta: float = 0.01, volume_beta: float | None = 0.1, temperature: float = 0.1,
                 nodes: Sequence[Hashable] | None = None, parameterisation: str = "center_offset",
                 init: float | Sequence[float] = (0.1, 0.5),
                 generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_int(num_nodes, "num_nodes", low=1)
        check_choice(method, METHODS, "method")
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
        self._index: dict[Hashable, int] | None = None

    @property
    def num_nodes(self) -> int:
        return self.embedding.num_entities

    @property
    def dim(self) -> int:
        return self.embedding.dim

    @property
    def device(self) -> torch.device:
        return self.embedding.param1.device

    def hparams(self) -> dict[str, Any]:
        """The constructor arguments (besides ``nodes``, ``generator``, ``device``)."""
        return dict(num_nodes=self.num_nodes, dim=self.dim, method=self.method, beta=self.beta,
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
        """The boxes of ``ids``."""
        return self.embedding(ids)

    def gather(self, ids: torch.Tensor) -> Box:
        """The boxes of ``ids`` (``(k,)`` integer, not range-checked: the trainer checks its
        pairs once) by ``index_select`` on the parameters: the same boxes as
        :meth:`forward`, whose ``F.embedding`` backward builds the dense ``(num_nodes, dim)``
        gradient about 3× slower on the CPU. Mirrors ``BoxEmbedding``'s parameterisations
        (tested against it)."""
        e = self.embedding
        ids = ids.to(device=e.param1.device, dtype=torch.long)
        p1, p2 = e.param1.index_select(0, ids), e.param2.index_select(0, ids)
        if e.parameterisation == "center_offset":
            return Box.from_center_offset(p1, F.softplus(p2))
        if e.parameterisation == "min_delta":
            return Box.from_min_delta(p1, p2)
        return Box.from_sigmoid(p1, p2)

    @property
    def noise(self) -> Noise | None:
        """The corner noise of the "normal" and "logistic" models (None for the others)."""
        kind = _NOISES.get(self.method)
        return None if kind is None else kind(self.beta)

    def _box_kwargs(self) -> dict[str, Any]:
        noise = self.noise
        if noise is not None:
            return {"noise": noise}
        if self.method == "gumbel":
            return {"beta": self.beta, "volume_beta": self.volume_beta}
        if self.method == "soft":
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

    def score_pairs(self, child: torch.Tensor, parent: torch.Tensor, n_pos: int = 0
                    ) -> PairScores:
        """Scores of the pairs ``(child[i], parent[i])`` whose first ``n_pos`` are positives:
        log P for all, log(1 − P) for the others (what the training loss needs).

        One embedding lookup for both ends. The child volumes are computed once per node when
        there are at least as many pairs as nodes, otherwise per pair, in the same call as the
        intersection volumes. No host synchronisation of its own.
        """
        n_pairs = child.shape[0]
        box = self.gather(torch.cat([child, parent]))
        cb, pb = box[:n_pairs], box[n_pairs:]
        if n_pairs >= self.num_nodes:
            return self.score_boxes(pb, cb, n_pos, self.log_volume()[child.to(self.device)])
        return self.score_boxes(pb, cb, n_pos)

    def score_boxes(self, parent: Box, child: Box, n_pos: int = 0,
                    log_child: torch.Tensor | None = None) -> PairScores:
        """:meth:`score_pairs` for given boxes ``(P, d)``; ``log_child``: the children's log
        volumes when known (else computed with the intersection volumes, in one call)."""
        noise = self.noise
        if noise is not None:          # quadrature boxes: the core functions
            if log_child is None:
                log_p = log_containment_prob(parent, child, noise=noise)
            else:                      # the children's volumes, computed once per node
                log_inter = expected_volume(parent, child, noise=noise, log=True)
                log_p = (log_inter - log_child).clamp(max=0.0)
            return PairScores(log_p, log1m_containment_prob(parent[n_pos:], child[n_pos:],
                                                            noise=noise))
        inter = intersection(parent, child, self.beta if self.method == "gumbel" else None)
        if log_child is None:
            both = self._log_volume_box(Box(torch.cat([inter.lower, child.lower]),
                                            torch.cat([inter.upper, child.upper])))
            log_inter, log_child = both.split(child.lower.shape[0])
        else:
            log_inter = self._log_volume_box(inter)
        log_p = log_inter - log_child
        if self.method == "hard":          # an empty hard child is contained in anything
            log_p = torch.where(torch.isneginf(log_child), torch.zeros_like(log_p), log_p)
        log_p = log_p.clamp(max=0.0)
        gumbel = self.method == "gumbel"
        log1m = _log1m_containment(log_p[n_pos:], parent[n_pos:], child[n_pos:],
                                   self.beta if gumbel else None,
                                   (self.volume_beta or self.beta) if gumbel else None, False)
        return PairScores(log_p, log1m)

    def log_volume(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Log (expected) volume of the boxes of ``ids`` (all boxes when None)."""
        return self._log_volume_box(self.embedding.all_boxes() if ids is None else self(ids))

    def _log_volume_box(self, box: Box) -> torch.Tensor:
        noise = self.noise
        if noise is not None:
            return expected_volume(box, noise=noise, log=True)
        if self.method == "gumbel":
            return volume(box, beta=self.volume_beta or self.beta, log=True)
        if self.method == "soft":
            return volume(box, temperature=self.temperature, log=True)
        return volume(box, log=True)

    def extra_repr(self) -> str:
        extra = {"gumbel": f", beta={self.beta}, volume_beta={self.volume_beta}",
                 "soft": f", temperature={self.temperature}", "hard": "",
                 "normal": f", beta={self.beta}", "logistic": f", beta={self.beta}"}[self.method]
        return f"num_nodes={self.num_nodes}, dim={self.dim}, method={self.method!r}{extra}"


def check_model(model: object) -> None:
    """ValueError unless ``model`` is a :class:`BoxHierarchyModel`."""
    if not isinstance(model, BoxHierarchyModel):
        raise ValueError(f"model must be a BoxHierarchyModel, got {type(model).__name__}")
