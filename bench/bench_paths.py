"""DAG paths: perturb's DAGPaths (Gibbs marginals, log-partition, longest path) vs pytorch-struct's
SemiMarkov CRF with one label, the same model.

Source-to-sink paths of the complete DAG on n nodes are the segmentations of n − 1 positions:
the edge i → j is a segment starting at i of length j − i. pytorch-struct's SemiMarkov takes
``edge[b, i, k, 0, 0]`` for that segment (K = n, impossible segments scored −1e9) and computes
the log-partition by a log-depth product of (K − 1)C x (K − 1)C charts, O(n³ log n) per graph
for K = n; ours is a linear scan, O(n²) work in n Python steps. Marginals: ours by the Markov
chain of the to-sink partition (one triangular solve), theirs by autograd of the log-partition.
Fwd+bwd rows differentiate ⟨C, μ⟩. pytorch-struct's chart makes it O(n³ log n) in time and
memory per graph at K = n (it is built for short segments), so it is timed at small n only. The
stronger comparison at larger n is the obvious implementation inside perturb: μ = ∇ log Z by
autograd of the same log-sum-exp DP (``create_graph=True``, then a double backward), which is
also what the Markov chain replaces for stability (docs/adding_a_structure.md). Timed on one
thread, interleaved (``time_interleaved``), the conversion to the peer's layout done before
timing.
"""
from __future__ import annotations

import torch

from bench._timing import count_ops, device, row, time_interleaved
from perturb import argmax, regularized_argmax
from perturb.structured import DAGPaths, dag_path_log_partition

try:  # the peer library
    import torch_struct
except Exception as exc:  # pragma: no cover - depends on the environment
    torch_struct = None
    _IMPORT_ERROR = repr(exc)

PATHS = DAGPaths()


def _to_peer(w: torch.Tensor) -> torch.Tensor:
    B, n, _ = w.shape
    edge = torch.full((B, n - 1, n, 1, 1), -1e9, dtype=w.dtype, device=w.device)
    i, j = torch.triu_indices(n, n, 1, device=w.device)
    edge[:, i, j - i, 0, 0] = w[:, i, j]
    return edge


def _from_peer(m: torch.Tensor, n: int) -> torch.Tensor:
    i, j = torch.triu_indices(n, n, 1, device=m.device)
    out = torch.zeros(m.shape[0], n, n, dtype=m.dtype, device=m.device)
    out[:, i, j] = m[:, i, j - i, 0, 0]
    return out


def _log_z_peer(edge: torch.Tensor) -> torch.Tensor:
    out = torch_struct.SemiMarkov().logpartition(edge)
    return out[0] if isinstance(out, tuple) else out


def _rows(B: int, n: int, dtype: torch.dtype, repeat: int, g: torch.Generator) -> list[dict]:
    dev = device()
    w = torch.randn(B, n, n, dtype=dtype, generator=g).to(dev)
    c = torch.randn(B, n, n, dtype=dtype, generator=g).to(dev)
    edge = _to_peer(w)
    c_peer = _to_peer(c).masked_fill(edge == -1e9, 0)    # the cotangent, peer layout
    size = f"{B}x{n}x{n} {str(dtype).replace('torch.float', 'f')}"

    def ours_fb():
        x = w.detach().requires_grad_()
        (regularized_argmax(x, PATHS) * c).sum().backward()

    def peer_fb():
        x = edge.detach().requires_grad_()
        (torch_struct.SemiMarkov().marginals(x) * c_peer).sum().backward()

    def ours_lz():
        dag_path_log_partition(w)

    def peer_lz():
        with torch.no_grad():
            _log_z_peer(edge.detach())

    def ours_max():
        argmax(w, PATHS)

    def peer_max():
        torch_struct.SemiMarkov(torch_struct.MaxSemiring).marginals(edge.detach().clone())

    mu = regularized_argmax(w, PATHS)
    diff = float((mu - _from_peer(torch_struct.SemiMarkov().marginals(edge.clone()), n))
                 .abs().max())
    z_peer = _from_peer(torch_struct.SemiMarkov(torch_struct.MaxSemiring).marginals(
        edge.clone()), n)
    same_max = bool(torch.equal(argmax(w, PATHS), (z_peer > 0.5).to(dtype)))
    out = []
    for what, fo, fp, note in [
        ("marginals fwd+bwd", ours_fb, peer_fb, f"max|μ − μ_peer| = {diff:.1e}"),
        ("log-partition fwd", ours_lz, peer_lz, ""),
        ("longest path", ours_max, peer_max, f"same paths: {same_max}"),
    ]:
        t = time_interleaved({"ours": fo, "peer": fp}, repeat=repeat)
        out.append(row(f"DAG paths {what} {size}", t["ours"], "torch-struct SemiMarkov",
                       t["peer"], note + ("; " if note else "") + f"interleaved, {repeat} "
                       "repeats, 1 thread", ops=count_ops(fo)))
    return out


def _autograd_rows(B: int, n: int, dtype: torch.dtype, repeat: int,
                   g: torch.Generator) -> list[dict]:
    dev = device()
    w = torch.randn(B, n, n, dtype=dtype, generator=g).to(dev)
    c = torch.randn(B, n, n, dtype=dtype, generator=g).to(dev)

    def ours_fb():
        x = w.detach().requires_grad_()
        (regularized_argmax(x, PATHS) * c).sum().backward()

    def autograd_fb():
        x = w.detach().requires_grad_()
        (mu,) = torch.autograd.grad(dag_path_log_partition(x).sum(), x, create_graph=True)
        (mu * c).sum().backward()

    x = w.detach().requires_grad_()
    (grad,) = torch.autograd.grad(dag_path_log_partition(x).sum(), x)
    diff = float((regularized_argmax(w, PATHS) - grad).abs().max())
    t = time_interleaved({"ours": ours_fb, "peer": autograd_fb}, repeat=repeat)
    return [row(f"DAG paths marginals fwd+bwd {B}x{n}x{n} "
                f"{str(dtype).replace('torch.float', 'f')}", t["ours"],
                "autograd of log Z (same DP)", t["peer"],
                f"max|μ − ∇ log Z| = {diff:.1e}; interleaved, {repeat} repeats, 1 thread",
                ops=count_ops(ours_fb))]


def run(quick: bool = False) -> list[dict]:
    if torch_struct is None:
        return [row("DAG paths", None, "torch-struct", None, f"peer missing: {_IMPORT_ERROR}")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # both libraries on one thread: a shared machine
    try:
        g = torch.Generator().manual_seed(0)
        peer = [(16, 32, torch.float64, 3)] if quick else [
            (16, 32, torch.float64, 5), (8, 48, torch.float32, 5)]
        ablation = [(16, 64, torch.float64, 3)] if quick else [
            (32, 64, torch.float64, 9), (8, 256, torch.float32, 5)]
        return ([r for B, n, dtype, repeat in peer for r in _rows(B, n, dtype, repeat, g)]
                + [r for B, n, dtype, repeat in ablation
                   for r in _autograd_rows(B, n, dtype, repeat, g)])
    finally:
        torch.set_num_threads(threads)
