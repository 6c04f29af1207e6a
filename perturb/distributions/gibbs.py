r"""The exponential family (Gibbs distribution) over the vertices of a structure.

For scores θ and a finite set Z of 0/1 structures,

.. math::

    p_\theta(z) = \exp(\langle\theta, z\rangle_Z - A(\theta)),\qquad
    A(\theta) = \log \sum_{z \in Z} e^{\langle\theta, z\rangle_Z},

with ⟨θ, z⟩_Z the family's score of a structure (for k-subsets and arborescences the plain inner
product over the allowed entries; for undirected trees each edge counted once). Everything
below is exact:

- ``partition`` = A(θ) (log Z), differentiable;
- ``marginals`` = ∇A(θ) = E_p[z] (= ``mean``), differentiable: the regularized argmax with the
  exponential-family entropy (:class:`perturb.ExpFamilyEntropy`);
- ``log_prob(z)`` = ⟨θ, z⟩_Z − A(θ);
- ``entropy()`` = A(θ) − ⟨θ, E_p[z]⟩_Z (the entropy of an exponential family);
- ``mode`` (= ``argmax``) = argmax_{z ∈ Z} ⟨θ, z⟩_Z, the most probable structure;
- ``sample(sample_shape, generator=None)`` draws exactly from p (the family's exact sampler).

There is no ``rsample``: no exact reparameterisation of p exists for these families. Use
``log_prob`` (exact) for score-function gradients, or :class:`PerturbedStructure` (perturb, then
take the regularized argmax) for a relaxed, reparameterised sample — of a *different*
distribution (the perturbed argmax of θ + ε, which equals p only on the simplex with Gumbel
noise).

``-inf`` scores mask entries (items, edges): they are never sampled, have marginal 0, and a
structure that uses one has ``log_prob`` = −inf.

Subclasses store their scores under the name in ``_param`` and implement the hooks
``_log_partition``, ``_marginals``, ``_sample``, ``_score_of`` and ``_argmax_of`` (the score and
the argmax for given scores: ``mode`` and ``topk`` use them).
"""
from __future__ import annotations

import math

import torch
from torch.types import _size
from torch.distributions import Distribution
from torch.distributions.utils import lazy_property

from perturb._deprecation import renamed
from perturb.distributions.constraints import StructureSupport, log_potential
from perturb.structures import Structure

__all__ = ["GibbsDistribution"]

# lazily computed results that expand() carries over (as views) instead of recomputing
_CACHED = ("partition", "marginals")


def _sample_count(sample_shape: _size) -> tuple[torch.Size, int]:
    """The sample shape as a ``torch.Size`` and its number of elements (ValueError if bad)."""
    try:
        shape = torch.Size(sample_shape)
    except TypeError:
        raise ValueError(f"sample_shape must be a tuple of ints (a torch.Size), "
                         f"got {sample_shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"sample_shape must have non-negative sizes, got {tuple(shape)}")
    return shape, math.prod(shape)


def _resolve_validate(validate_args: bool | None) -> bool:
    """The effective ``validate_args`` (torch's default when None); ValueError if not a bool."""
    if validate_args is None:
        return bool(Distribution._validate_args)
    if not isinstance(validate_args, bool):
        raise ValueError(f"validate_args must be a bool or None, got {validate_args!r}")
    return validate_args


def _scores_argument(fn: str, logits: torch.Tensor | None, old: str,
                     old_value: torch.Tensor | None) -> torch.Tensor:
    """The scores, passed as ``logits`` (the one name across the families, as in
    ``torch.distributions``) or under their former name ``old`` (a ``FutureWarning``)."""
    value = renamed(fn, old, old_value, "logits", logits, None)
    if value is None:
        raise TypeError(f"{fn}() missing the scores: pass logits=")
    return value


def _validate_with(structure: Structure, theta: torch.Tensor, name: str, validate: bool) -> None:
    """``structure.validate(theta, name)``: its structural checks always, its value checks (NaN,
    inf) only when ``validate`` and perturb's validation switch are both on.

    With ``validate=False`` the structure validates a meta tensor of θ's shape and dtype: it
    has no values, so the value checks have nothing to read and skip
    (:func:`~perturb._validation.unreadable`), and no global switch is flipped.
    """
    if validate:
        structure.validate(theta, name)
    else:
        structure.validate(torch.empty(theta.shape, dtype=theta.dtype, device="meta"), name)


def _masked_score(theta: torch.Tensor, z: torch.Tensor, allowed: torch.Tensor | None,
                  event_dim: int) -> torch.Tensor:
    """Σ θ·z over the event dims and the ``allowed`` entries, with 0·(−inf) = 0.

    Where z ≠ 0 and θ = −inf the result is −inf (a masked entry used); where z = 0 the score
    is never read, so its gradient is 0 (no NaN). Shape: broadcast of ``(*, *event)`` ->
    ``(*)``.
    """
    used = z != 0
    if allowed is not None:
        used = used & allowed
    prod = torch.where(used, theta, torch.zeros((), dtype=theta.dtype, device=theta.device)) * z
    if allowed is not None:
        prod = torch.where(allowed, prod, torch.zeros((), dtype=prod.dtype, device=prod.device))
    return prod.sum(dim=tuple(range(-event_dim, 0)))


class GibbsDistribution(Distribution):
    r"""Base class of the Gibbs distributions p(z) ∝ exp⟨θ, z⟩_Z over a structure's vertices.

    See the module docstring for the quantities and why there is no ``rsample``. Concrete
    families: :class:`~perturb.distributions.KSubsetDistribution`,
    :class:`~perturb.distributions.SpanningTreeDistribution`,
    :class:`~perturb.distributions.ArborescenceDistribution`.

    Shape: scores ``(*batch, *event)``; ``batch_shape = (*batch)``, ``event_shape`` the trailing
    ``structure.event_dim`` dims; ``sample(sample_shape)`` -> ``(*sample_shape, *batch, *event)``
    0/1 in the scores' dtype; ``log_prob(z)``: ``(*sample, *batch, *event)`` ->
    ``(*sample, *batch)``; ``partition``, ``entropy()``: ``(*batch)``; ``marginals``, ``mode``:
    ``(*batch, *event)``.
    """

    arg_constraints = {"logits": log_potential}
    has_rsample = False
    has_enumerate_support = True
    #: attribute name of the scores (``"logits"`` in every family)
    _param: str = "logits"

    def __init__(self, logits: torch.Tensor, structure: Structure,
                 validate_args: bool | None = None):
        setattr(self, self._param, logits)
        self.structure = structure
        d = structure.event_dim
        super().__init__(logits.shape[:logits.ndim - d], logits.shape[logits.ndim - d:],
                         validate_args=validate_args)

    # -- hooks ---------------------------------------------------------------------------------

    @property
    def _theta(self) -> torch.Tensor:
        return getattr(self, self._param)

    def _log_partition(self) -> torch.Tensor:
        raise NotImplementedError

    def _marginals(self) -> torch.Tensor:
        raise NotImplementedError

    def _argmax(self) -> torch.Tensor:
        return self._argmax_of(self._theta.detach())

    def _sample(self, n_samples: int | None, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    def _score(self, z: torch.Tensor) -> torch.Tensor:
        """⟨θ, z⟩_Z for 0/1 structures or marginals z, ``(*, *event)`` -> ``(*)``."""
        return self._score_of(self._theta, z)

    def _score_of(self, theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """⟨θ, z⟩_Z for given scores ``theta`` (broadcasting with ``z``)."""
        raise NotImplementedError

    def _argmax_of(self, theta: torch.Tensor) -> torch.Tensor:
        """argmax_z ⟨θ, z⟩_Z for given scores ``(*, *event)`` (``-inf`` masks entries)."""
        raise NotImplementedError

    # -- exact quantities ----------------------------------------------------------------------

    @property
    def log_potentials(self) -> torch.Tensor:
        """The scores under pytorch-struct's name (the same tensor as ``logits``)."""
        return self._theta

    @property
    def support(self) -> StructureSupport:
        """The vertices Z (:class:`~perturb.distributions.constraints.StructureSupport`)."""
        return StructureSupport(self.structure)

    # lazy_property computes under torch.enable_grad(): a value first asked for inside
    # torch.no_grad() still carries its graph, so later gradients stay right
    @lazy_property
    def partition(self) -> torch.Tensor:
        """log Z = A(θ) = log Σ_{z∈Z} exp⟨θ, z⟩_Z, shape ``(*batch)``; differentiable, cached."""
        return self._log_partition()

    @lazy_property
    def marginals(self) -> torch.Tensor:
        """μ = E_p[z] = ∇A(θ), shape ``(*batch, *event)``; differentiable, cached."""
        return self._marginals()

    @property
    def mean(self) -> torch.Tensor:
        """E_p[z], the marginals."""
        return self.marginals

    @property
    def variance(self) -> torch.Tensor:
        """Var_p[z] entrywise, μ(1 − μ) (each entry of z is 0/1)."""
        mu = self.marginals
        return mu * (1 - mu)

    @property
    def mode(self) -> torch.Tensor:
        """The most probable structure argmax_{z∈Z} ⟨θ, z⟩_Z, ``(*batch, *event)``, no grad."""
        with torch.no_grad():
            return self._argmax()

    @property
    def argmax(self) -> torch.Tensor:
        """Alias of :attr:`mode` (pytorch-struct's name)."""
        return self.mode

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(z) = ⟨θ, z⟩_Z − A(θ); −inf for a structure using a masked (−inf) entry.

        Shape: ``(*sample, *batch, *event)`` -> ``(*sample, *batch)``.

        Raises:
            ValueError: (``validate_args``) ``value`` is not broadcastable to
                ``batch_shape + event_shape`` or is not in the support (not a 0/1 structure).
        """
        if self._validate_args:
            self._validate_sample(value)
        theta = self._theta
        return self._score(value.to(theta.dtype)) - self.partition

    def entropy(self) -> torch.Tensor:
        """H(p) = A(θ) − ⟨θ, μ⟩_Z, exact and differentiable; shape ``(*batch)``.

        The difference cancels two terms of size ``|θ|·(structure size)``, so below float64 it is
        computed in float64 (and returned in θ's dtype): in float32, scores of 1e4 would leave
        an error of ~1e-3, even a negative entropy."""
        if self._theta.dtype == torch.float64:
            return self.partition - self._score(self.marginals)
        wide = self._in_float64()
        return (wide.partition - wide._score(wide.marginals)).to(self._theta.dtype)

    def cross_entropy(self, other: "GibbsDistribution") -> torch.Tensor:
        """H(p, q) = −E_p[log q(z)] = A(θ_q) − ⟨θ_q, μ_p⟩_Z for ``other`` = q of the same
        family and structure (pytorch-struct's ``cross_entropy``); +inf where q masks an entry
        p uses. Exact, differentiable in both; computed in float64 below it (as
        :meth:`entropy`). Shape: the broadcast batch shape.

        Raises:
            ValueError: ``other`` is not the same family over the same structure.
        """
        self._check_same_family(other, "other")
        p, q = (self, other) if self._theta.dtype == torch.float64 else (
            self._in_float64(), other._in_float64())
        out = q.partition - q._score(p.marginals)
        return out.to(self._theta.dtype)

    def topk(self, k: int) -> torch.Tensor:
        """The k most probable structures, best first (pytorch-struct's ``topk``), exact.

        Lawler's k-best partitioning with the family's exact argmax: the best structure of a
        subproblem (entries forced in and out) is split into one subproblem per free entry it
        uses (that entry out, the previous ones in), and the best open subproblem is taken
        next. Forcing is done on the scores (a large negative score out, a large positive one
        in; a structure that breaks a constraint is infeasible and dropped), so it works for any
        family with an exact argmax; all batch elements and all children of a step are solved
        in one batched argmax (k steps in all). Computed in float64.

        Args:
            k: how many structures (≥ 1). Where Z has fewer than k members (tiny n, or
                masked entries), the list is completed by repeating its last structure.

        Shape: ``(k, *batch, *event)``, 0/1 in the scores' dtype; no gradient.

        Raises:
            ValueError: k < 1.

        Example::

            >>> from perturb.distributions import KSubsetDistribution
            >>> d = KSubsetDistribution(torch.tensor([3.0, 2.0, 1.0, 0.0]), k=2)
            >>> d.topk(3)
            tensor([[1., 1., 0., 0.],
                    [1., 0., 1., 0.],
                    [0., 1., 1., 0.]])
        """
        from perturb._validation import check_int
        k = check_int(k, "k", low=1)
        with torch.no_grad():
            return _lawler_topk(self, k)

    def _items(self, z: torch.Tensor) -> torch.Tensor:
        """The entries of a structure that Lawler's partition branches on, ``(*, E)`` booleans
        over the flattened event (each edge once: subclasses override for symmetric events)."""
        return z.flatten(-len(self.event_shape)) != 0

    def _spread(self, mask: torch.Tensor) -> torch.Tensor:
        """An entry mask over the flattened event, extended to the entries that stand for the
        same item (the other triangle of a symmetric event)."""
        return mask

    def _check_same_family(self, other: object, name: str) -> None:
        if type(other) is not type(self) or other.structure != self.structure \
                or other.event_shape != self.event_shape:
            raise ValueError(
                f"{name} must be a {type(self).__name__} over the same structure "
                f"({self.structure!r}, event shape {tuple(self.event_shape)}), got "
                f"{other!r}")

    def _in_float64(self) -> "GibbsDistribution":
        """The same distribution with float64 scores (nothing cached carried over)."""
        new = object.__new__(type(self))
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in _CACHED})
        new.__dict__[self._param] = self._theta.double()
        return new

    def sample(self, sample_shape: _size = torch.Size(),
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact samples z ~ p, ``(*sample_shape, *batch, *event)``, 0/1 in θ's dtype, no grad.

        Args:
            sample_shape: leading sample dims.
            generator: a ``torch.Generator`` (on θ's device) for reproducible samples.
        """
        shape, count = _sample_count(sample_shape)
        theta = self._theta
        out_shape = shape + self.batch_shape + self.event_shape
        if count == 0:
            return theta.new_zeros(out_shape)
        with torch.no_grad():
            z = self._sample(None if not shape else count, generator)
        return z.reshape(out_shape)

    def rsample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        """Not available: no exact reparameterisation of a Gibbs distribution over structures.

        Raises:
            NotImplementedError: always, naming the alternatives (module docstring).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no rsample: a Gibbs distribution over structures has no "
            "exact reparameterisation. Use log_prob (exact) for score-function gradients, or "
            "PerturbedStructure(theta, structure, noise, tau).rsample() for a relaxed sample of "
            "the perturbed argmax (a different distribution, see perturb.distributions.gibbs)")

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """Every structure of Z (tiny n only: ``structure.enumerate``).

        Shape: ``(|Z|, *batch, *event)`` with ``expand``, else ``(|Z|, 1, ..., 1, *event)``.
        """
        theta = self._theta
        z = self.structure.enumerate(self.event_shape[-1], dtype=theta.dtype, device=theta.device)
        z = z.reshape(z.shape[:1] + (1,) * len(self.batch_shape) + self.event_shape)
        if expand:
            z = z.expand(z.shape[:1] + self.batch_shape + self.event_shape)
        return z

    def expand(self, batch_shape: _size, _instance=None):
        """A view with a larger batch shape (scores and cached results broadcast, not copied)."""
        new = self._get_checked_instance(type(self), _instance)
        batch_shape = torch.Size(batch_shape)
        for key, value in self.__dict__.items():
            if key in ("_batch_shape", "_event_shape", "_validate_args"):
                continue
            if key in (self._param, *_CACHED):
                event = () if key == "partition" else self.event_shape
                value = value.expand(batch_shape + event)
            new.__dict__[key] = value
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def __repr__(self) -> str:
        extra = self._repr_extra()
        return (f"{type(self).__name__}({self._param}: {tuple(self._theta.shape)}"
                + (f", {extra}" if extra else "") + ")")

    def _repr_extra(self) -> str:
        return ""


def _lawler_topk(d: GibbsDistribution, k: int) -> torch.Tensor:
    """Lawler's k-best structures of ``d`` (:meth:`GibbsDistribution.topk`), batched: each step
    takes the best open subproblem of every problem and solves its (at most m, the items of a
    structure) children in one argmax call."""
    theta = d._theta.detach().double()
    event = d.event_shape
    E = math.prod(event)
    flat = theta.reshape(-1, E)                                        # (B, E)
    B = flat.shape[0]
    finite = torch.where(torch.isfinite(flat), flat.abs(), torch.zeros_like(flat))
    big = 4.0 * (E + 1) * (finite.amax() + 1.0)   # beats any sum of free scores
    arange = torch.arange(B, device=flat.device)

    def solve(inc_: torch.Tensor, exc_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Best structure under the constraints ``(B, c, E)``, and its score (−inf when it
        breaks one: infeasible). Out: −big (finite, so the solver still finds a structure), in:
        +big."""
        c = inc_.shape[1]
        w = flat[:, None].expand(B, c, E)
        w = torch.where(exc_, w - big, torch.where(inc_, w + big, w))
        z = d._argmax_of(w.reshape(B, c, *event)).reshape(B, c, E).to(flat.dtype)
        used = z != 0
        ok = ~(used & exc_).any(-1) & ~(inc_ & ~used).any(-1)
        sc = d._score_of(flat[:, None].expand(B, c, E).reshape(B, c, *event),
                         z.reshape(B, c, *event))
        return z, torch.where(ok & torch.isfinite(sc), sc, -math.inf)

    none = torch.zeros(B, 1, E, dtype=torch.bool, device=flat.device)
    z0, s0 = solve(none, none)
    m = int(d._items(z0.reshape(B, 1, *event)).sum(-1).max())        # items per structure
    inc = [none]
    exc = [none]
    sol = [z0]
    score = [s0]
    out: list[torch.Tensor] = []
    for _ in range(k):
        pool_score = torch.cat(score, 1)
        best = pool_score.argmax(-1)                                        # (B,)
        z = torch.cat(sol, 1)[arange, best]
        found = torch.isfinite(pool_score[arange, best])
        out.append(torch.where(found[:, None], z, out[-1]) if out else z)
        i0, e0 = torch.cat(inc, 1)[arange, best], torch.cat(exc, 1)[arange, best]
        # drop the taken subproblem
        offsets = torch.tensor([0] + [t.shape[1] for t in score], device=flat.device).cumsum(0)
        for chunk, start in zip(score, offsets[:-1].tolist()):
            hit = (best >= start) & (best < start + chunk.shape[1])
            chunk[arange[hit], best[hit] - start] = -math.inf
        if m == 0:
            continue
        # children: for the j-th free item of z (in entry order): it out, the earlier ones in
        # (none for a problem whose pool is exhausted: its z is a stale pool entry)
        free = d._items(z.reshape(B, *event)) & ~i0 & found[:, None]       # (B, E)
        pos = torch.argsort((~free).to(torch.int8), dim=-1, stable=True)[:, :m]   # (B, m)
        valid = free.gather(-1, pos)                                        # (B, m)
        item = torch.zeros(B, m, E, dtype=torch.bool, device=flat.device)
        item.scatter_(-1, pos[..., None], valid[..., None])
        earlier = (item.cumsum(1) - item.to(torch.long)).bool()             # items before j
        c_inc = d._spread(i0[:, None, :] | earlier)
        c_exc = d._spread(e0[:, None, :] | item)
        cz, cs = solve(c_inc, c_exc)
        inc.append(c_inc)
        exc.append(c_exc)
        sol.append(cz)
        score.append(torch.where(valid, cs, -math.inf))
    return torch.stack(out).reshape(k, *d.batch_shape, *event).to(d._theta.dtype)
