"""The peer of the hierarchy trainer: the epoch a box-embeddings user writes by hand.

A plain PyTorch loop over box-embeddings 0.1.0's ``BoxTensor``, ``GumbelIntersection`` and
``BesselApproxVolume`` (log scale) with Adam, on the same positives, batch size, negatives per
positive, dimension, Gumbel β (intersection) and β_vol (volume) as ours, and the same
center/offset parameterisation started from the same boxes. Per step:

- negatives: each positive repeated ``k`` times, its child or its parent (probability 1/2)
  replaced by a uniform node; no filtering against the known pairs (ours rejects those);
- ``log p = min(0, log Vol(parent ∩ child) − log Vol(child))`` with the softplus
  approximation of the Bessel volume (ours: the exact one);
- loss ``mean(−log p)`` over the positives ``+ mean(−log(1 − p))`` over the negatives, with
  ``log(1 − p) = log(−expm1(log p))`` (ours: the accurate nested-pair form);
- Adam over the full parameter tensors (the same optimizer settings as ours).

``volume="exact"`` swaps in our exact Bessel log volume
(:func:`perturb.boxes.volume`, ``approx=False``) to separate the cost of the volume from the
cost of the loop.

``sparse=True`` is the lazy-Adam variant a torch user writes: ``F.embedding(..., sparse=True)``
(sparse COO gradients of the two tables) and ``torch.optim.SparseAdam`` (the comparison of
``HierarchyConfig(optimizer="sparse_adam")``). box-embeddings itself has no sparse option; the
gathers are this loop's own ``F.embedding`` calls.

``box="soft"`` is box-embeddings' soft box instead: ``HardIntersection`` and ``SoftVolume``
(softplus of the sides at temperature T, log scale). ``known`` (a
:class:`perturb.boxes.losses.PairSet`) draws the negatives with the sampler of the protocol
being compared (:func:`perturb.boxes.losses.sample_negatives`, never a known pair) instead of
unfiltered; the learning experiment of ``examples/box_hierarchy.py --peer box-embeddings`` uses
both, so that only the box model and the loop differ.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

EULER_GAMMA = 0.5772156649015329


class PeerLoop:
    """State of the hand-written loop: parameters ``center`` and ``raw`` (softplus half-width),
    its Adam and generator.

    Args:
        center, raw: ``(n, d)`` initial parameters (copied).
        positives: ``(m, 2)`` (child, parent) ids.
        beta, volume_beta: Gumbel scales of the intersection and of the volume.
        batch_size, negatives: per step.
        lr: Adam's learning rate.
        volume: "approx" (box-embeddings' ``BesselApproxVolume``) or "exact" (ours); Gumbel
            boxes only.
        seed: the loop's generator.
        box: "gumbel" or "soft" (``HardIntersection``, ``SoftVolume`` at ``temperature``).
        temperature: softplus temperature of the soft box.
        known: pairs never drawn as negatives (filtered sampler), or None (unfiltered).
        sparse: sparse row gradients and ``torch.optim.SparseAdam`` instead of Adam.
    """

    def __init__(self, center: torch.Tensor, raw: torch.Tensor, positives: torch.Tensor, *,
                 beta: float, volume_beta: float, batch_size: int, negatives: int, lr: float,
                 volume: str = "approx", seed: int = 0, box: str = "gumbel",
                 temperature: float = 1.0, known=None, sparse: bool = False) -> None:
        from box_embeddings.modules.intersection import GumbelIntersection, HardIntersection
        from box_embeddings.modules.volume import BesselApproxVolume, SoftVolume
        from box_embeddings.parameterizations.box_tensor import BoxTensor

        self.box_tensor = BoxTensor
        self.center = torch.nn.Parameter(center.detach().clone())
        self.raw = torch.nn.Parameter(raw.detach().clone())
        self.positives = positives
        self.n = center.shape[0]
        self.batch_size, self.k = batch_size, negatives
        self.known = known
        if box not in ("gumbel", "soft"):
            raise ValueError(f"box must be 'gumbel' or 'soft', got {box!r}")
        self.intersect = GumbelIntersection(intersection_temperature=beta)
        if box == "soft":
            self.intersect = HardIntersection()
            self.log_volume = SoftVolume(log_scale=True, volume_temperature=temperature)
        elif volume == "approx":
            self.log_volume = BesselApproxVolume(log_scale=True, volume_temperature=volume_beta,
                                                 intersection_temperature=beta)
        elif volume == "exact":
            from perturb.boxes import Box, volume as our_volume

            def exact(box):
                return our_volume(Box(box.z, box.Z), beta=volume_beta, log=True)
            self.log_volume = exact
        else:
            raise ValueError(f"volume must be 'approx' or 'exact', got {volume!r}")
        self.sparse = sparse
        if sparse:
            self.opt = torch.optim.SparseAdam([self.center, self.raw], lr=lr)
            self.gen = torch.Generator().manual_seed(seed)
            return
        try:
            self.opt = torch.optim.Adam([self.center, self.raw], lr=lr, fused=True)
        except (RuntimeError, ValueError):
            self.opt = torch.optim.Adam([self.center, self.raw], lr=lr)
        self.gen = torch.Generator().manual_seed(seed)

    def negatives(self, batch: torch.Tensor) -> torch.Tensor:
        """``k`` negatives per positive of ``batch``: ``(m k, 2)``."""
        if self.known is not None:
            from perturb.boxes.losses import sample_negatives
            return sample_negatives(batch, self.n, self.k, known=self.known,
                                    generator=self.gen, strict=False).reshape(-1, 2)
        base = batch.repeat_interleave(self.k, dim=0)
        ent = torch.randint(self.n, (base.shape[0],), generator=self.gen)
        side = torch.randint(2, (base.shape[0],), generator=self.gen)
        return torch.stack([torch.where(side == 0, ent, base[:, 0]),
                            torch.where(side == 1, ent, base[:, 1])], dim=1)

    def log_p(self, pairs: torch.Tensor) -> torch.Tensor:
        """log P(child ⊆ parent) of ``(P, 2)`` (child, parent) ids, ≤ 0: ``(P,)``."""
        ids = torch.cat([pairs[:, 0], pairs[:, 1]])
        c = F.embedding(ids, self.center, sparse=self.sparse)
        h = F.softplus(F.embedding(ids, self.raw, sparse=self.sparse))
        box = self.box_tensor.from_zZ(c - h, c + h)
        p = pairs.shape[0]
        child = self.box_tensor.from_zZ(box.z[:p], box.Z[:p])
        parent = self.box_tensor.from_zZ(box.z[p:], box.Z[p:])
        log_inter = self.log_volume(self.intersect(parent, child))
        return (log_inter - self.log_volume(child)).clamp(max=0.0)

    @torch.no_grad()
    def score(self, pairs: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
        """:meth:`log_p` without gradients, in chunks (for evaluation)."""
        return torch.cat([self.log_p(c) for c in pairs.split(chunk)])

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """The loss of one batch of positives and its fresh negatives."""
        m = batch.shape[0]
        log_p = self.log_p(torch.cat([batch, self.negatives(batch)]))
        log1m = torch.log(-torch.expm1(log_p[m:].clamp(max=-1e-7)))
        return -log_p[:m].mean() - log1m.mean()

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def run_epoch(self, steps: int | None = None) -> float:
        """One shuffled pass over the positives (or its first ``steps`` batches); the mean
        loss (one host read)."""
        perm = torch.randperm(self.positives.shape[0], generator=self.gen)
        batches = perm.split(self.batch_size)
        if steps is not None:
            batches = batches[:steps]
        total = torch.zeros(())
        for idx in batches:
            total += self.step(self.positives[idx])
        return float(total) / len(batches)
