"""Issue 29's regimes, each beside the peer it is measured against: a case file for

    python -m bench.compare_revisions BEFORE [AFTER] --cases bench/regime_cases.py

Each worker of :mod:`bench.compare_revisions` runs this file against its own revision of
``perturb`` (public functions only, unchanged since before issue 29: ``sinkhorn``,
``arborescence_marginals``, ``relaxed_topk``, ``regularized_argmax`` and the example
``examples/correlated_topk.py`` of that revision), so one run gives every ratio to a peer before
and after, the peer timed back to back with ours in the same process. ``PAIRS`` lists
(ours, peer, target). Not here: the box trainer against the box-embeddings loop (WordNet and
seconds per epoch; ``python -m bench --only boxes``) and the CUDA rows.

Self-contained on purpose (its small helpers repeat ``bench_trees``'s): a worker's ``bench``
package is that of its revision, whose modules may import private names the revision lacks.
"""
import pathlib
import sys
import warnings

import torch

import perturb
from perturb import structured as st

warnings.simplefilter("ignore")     # convergence and peer warnings do not change the timing
try:
    import ot.batch as ot_batch
except ImportError:                 # pragma: no cover - the bench extra
    ot_batch = None
try:
    from torch_struct import NonProjectiveDependencyCRF
except ImportError:                 # pragma: no cover - the bench extra
    NonProjectiveDependencyCRF = None

CASES = {}
PAIRS = []


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _fwd_bwd(fn, x, cot):
    """One forward and backward of ``fn`` at ``x`` with the cotangent ``cot``."""
    def run():
        y = x.detach().requires_grad_(True)
        (fn(y) * cot).sum().backward()
        return y.grad
    return run


# Sinkhorn, three regimes (bench_sinkhorn.REGIMES): ours sinkhorn(-M, τ) against POT's batched
# exp-domain method at equal tolerance (POT's in mass units, tol / n)
_SINKHORN = {
    "easy": ("U[0, 1)", 0.2, torch.float64, 1e-6, 20000, 32, 128, "≤ 0.5"),
    "moderate": ("N(0, 1)", 0.2, torch.float32, 1e-4, 5000, 32, 128, "≤ 0.3"),
    "hard": ("N(0, 1)", 0.05, torch.float64, 1e-6, 20000, 16, 64, "≤ 0.05"),
}
for _name, (_kind, _tau, _dt, _tol, _cap, _b, _n, _target) in _SINKHORN.items():
    _M = (torch.rand if _kind == "U[0, 1)" else torch.randn)(_b, _n, _n, generator=_gen(0),
                                                               dtype=_dt)
    _ours = f"sinkhorn {_name} {_b}x{_n}x{_n} {str(_dt)[-7:]} tau={_tau} tol={_tol:g} fwd"
    CASES[_ours] = (lambda M=_M, tau=_tau, cap=_cap, tol=_tol:
                    st.sinkhorn(-M, tau=tau, n_iters=cap, tol=tol))
    if ot_batch is not None:
        _peer = f"POT solve_batch sinkhorn ({_name})"
        CASES[_peer] = (lambda M=_M, tau=_tau, cap=_cap, tol=_tol, n=_n: ot_batch.solve_batch(
            M, tau, max_iter=cap, tol=tol / n, method="sinkhorn", grad="detach").plan)
        PAIRS.append([_ours, _peer, _target])


# Arborescence marginals against torch-struct's NonProjectiveDependencyCRF (bench_trees: N words,
# the diagonal of φ holds the root scores; ours n = N + 1 nodes, root 0)
def _to_ours(phi):
    w = torch.zeros(phi.shape[0], phi.shape[1] + 1, phi.shape[1] + 1, dtype=phi.dtype)
    w[:, 1:, 1:] = phi
    w[:, 0, 1:] = torch.diagonal(phi, dim1=-2, dim2=-1)
    return w


def _from_ours(mu):
    out = mu[:, 1:, 1:].clone()
    idx = torch.arange(out.shape[-1])
    out[:, idx, idx] = mu[:, 0, 1:]
    return out


for _b, _n, _dt in ((16, 63, torch.float64), (64, 127, torch.float32)):
    for _scale in (1, 20):
        _phi = _scale * torch.randn(_b, _n, _n, dtype=_dt, generator=_gen(3))
        _cot = torch.randn(_b, _n + 1, _n + 1, dtype=_dt, generator=_gen(4))
        _size = f"{_b}x{_n + 1}x{_n + 1} {str(_dt)[-7:]}" + (f" scores x{_scale}"
                                                              if _scale != 1 else "")
        _ours = f"arborescence_marginals {_size} fwd+bwd"
        CASES[_ours] = _fwd_bwd(lambda y: st.arborescence_marginals(y, root=0),
                                _to_ours(_phi), _cot)
        if NonProjectiveDependencyCRF is not None:
            _peer = f"torch-struct marginals {_size} fwd+bwd"
            CASES[_peer] = _fwd_bwd(
                lambda y: NonProjectiveDependencyCRF(y, multiroot=True).marginals, _phi,
                _from_ours(_cot))
            PAIRS.append([_ours, _peer, "≤ 1.0"])

# The k-subset DP (ExpFamilyEntropy top-k) against the closed-form Entropy relaxation
_x = torch.randn(256, 1000, generator=_gen(5))
_cot = torch.randn(256, 1000, generator=_gen(6))
CASES["relaxed_topk ExpFamilyEntropy 256x1000 k=10 f32 fwd+bwd"] = _fwd_bwd(
    lambda y: st.relaxed_topk(y, 10, regularizer=perturb.ExpFamilyEntropy()), _x, _cot)
CASES["relaxed_topk Entropy 256x1000 k=10 f32 fwd+bwd"] = _fwd_bwd(
    lambda y: st.relaxed_topk(y, 10), _x, _cot)
PAIRS.append(["relaxed_topk ExpFamilyEntropy 256x1000 k=10 f32 fwd+bwd",
              "relaxed_topk Entropy 256x1000 k=10 f32 fwd+bwd", "≤ 2"])

# Correlated top-k: a training step of examples/correlated_topk.py (that revision's example, at
# its default size) against the same step with the plain ExpFamilyEntropy top-k
sys.path.insert(0, str(pathlib.Path.cwd() / "examples"))
import correlated_topk as _ex  # noqa: E402  (the worker's revision of the example)

_args = _ex.parse_args([])
_xs, _ts, _ = _ex.make_data(40 * _args.batch_size, _args.d, _args.k, _args.sigma, _gen(0))


def _trainer(method):
    torch.manual_seed(0)
    sel, reg = _ex.Selector(_args.hidden), _ex.regressor(_args.d, _args.hidden)
    opt = torch.optim.Adam([*sel.parameters(), *reg.parameters()], lr=_args.lr)
    noise, i, bs = _gen(1), [0], _args.batch_size

    def step():
        j = i[0] % 40
        i[0] += 1
        xb, tb = _xs[j * bs:(j + 1) * bs], _ts[j * bs:(j + 1) * bs]
        mask = _ex.select(method, sel, xb, _args.k, _args.tau, noise, exact=False)
        loss = ((reg(xb * mask).squeeze(-1) - tb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


_size = f"d={_args.d}, batch {_args.batch_size}, k={_args.k}"
_ours = f"correlated_topk.py step, CorrelatedKSubset ({_size})"
_peer = f"correlated_topk.py step, top-k ExpFamilyEntropy ({_size})"
CASES[_ours] = _trainer(list(_ex.METHODS)[0])
CASES[_peer] = _trainer("top-k ExpFamilyEntropy")
PAIRS.append([_ours, _peer, "≤ 3"])
