"""Simplex relaxations side by side with their peers, forward + backward.

- ``gumbel_softmax`` (soft and hard), ``relax(θ, Simplex(), Gumbel())`` and the same with
  validation off, vs ``torch.nn.functional.gumbel_softmax``, on (2048, 1000) float32 logits
  and, unless ``--quick`` on a CPU, on (16384, 4096) (the issue's targets on an H100: ratio
  <= 1.1 at the small size, <= 0.6 at the large one; CPU <= 1.0);
- ``gaussian_softmax`` vs the same math written inline in torch (``softmax((x + randn)/τ)``);
- on CUDA, ``gumbel_softmax`` with the compiled path off (``set_compiled(False)``): the eager
  composition that the compiled path replaces;
- ``sparsemax`` vs ``entmax.sparsemax`` (Peters et al.; a note when entmax is not installed).

Both sides run in the same process on the same inputs, on ``--device``, timed in alternation
(``time_interleaved``; medians). Extra columns: ``ops`` (aten ops dispatched per call on CPU,
kernel launches on CUDA) and ``syncs`` (host synchronisations per call), both of our side, and
for the elementwise rows ``gbps``: the bytes an ideal fused forward + backward must move, over our
time. We count 5 tensors of the logits' size: the forward reads θ and writes y, the backward reads
g and y and writes ∂θ (the noise is generated in registers, so it costs no traffic), i.e.
20 bytes per element in float32, whatever the implementation actually moves.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench._timing import count_ops, count_syncs, device, row, time_interleaved
from perturb import Gumbel, Simplex, relax
from perturb._validation import set_validation
from perturb.categorical import gaussian_softmax, gumbel_softmax, set_compiled, sparsemax

_IDEAL_TENSORS = 5  # θ and y forward; g, y and ∂θ backward (module docstring)


def _fwd_bwd(fn, x, g):
    def step():
        x.grad = None
        fn(x).backward(g)
    return step


def _unchecked(fn, *args, **kwargs):
    with set_validation(False):
        return fn(*args, **kwargs)


def _eager(fn, *args, **kwargs):
    with set_compiled(False):
        return fn(*args, **kwargs)


def _pair(name, ours, peer_name, peer, x, g, repeat, note="", elementwise=True):
    ours_step, peer_step = _fwd_bwd(ours, x, g), _fwd_bwd(peer, x, g)
    extra = {"ops": count_ops(ours_step), "syncs": count_syncs(ours_step)}
    times = time_interleaved({"ours": ours_step, "peer": peer_step}, repeat=repeat)
    if elementwise:
        moved = _IDEAL_TENSORS * x.numel() * x.element_size()
        extra["gbps"] = moved / (times["ours"] * 1e-3) / 1e9
    return row(name, times["ours"], peer_name, times["peer"], note, **extra)


def _gumbel_rows(shape, repeat):
    dev = device()
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(*shape, generator=gen, device=dev).requires_grad_()
    g = torch.randn(*shape, generator=gen, device=dev)
    size = f"{shape[0]}x{shape[1]} f32, fwd+bwd"
    torch_gs = "torch.nn.functional.gumbel_softmax"
    rows = [
        _pair(f"gumbel_softmax tau=0.5 ({size})", lambda v: gumbel_softmax(v, tau=0.5),
              torch_gs, lambda v: F.gumbel_softmax(v, tau=0.5), x, g, repeat,
              note="default path: validation on" + (", compiled" if dev.type == "cuda" else "")),
        _pair(f"gumbel_softmax, set_validation(False) ({size})",
              lambda v: _unchecked(gumbel_softmax, v, tau=0.5),
              torch_gs, lambda v: F.gumbel_softmax(v, tau=0.5), x, g, repeat,
              note="without the finiteness check (one reduction)"),
    ]
    if dev.type == "cuda":
        rows.append(_pair(f"gumbel_softmax, set_compiled(False) ({size})",
                          lambda v: _eager(gumbel_softmax, v, tau=0.5),
                          torch_gs, lambda v: F.gumbel_softmax(v, tau=0.5), x, g, repeat,
                          note="the eager composition (validation on)"))
    rows += [
        _pair(f"gumbel_softmax hard ({size})", lambda v: gumbel_softmax(v, 0.5, hard=True),
              torch_gs + " (hard)", lambda v: F.gumbel_softmax(v, 0.5, hard=True), x, g,
              repeat),
        _pair(f"relax(Simplex(), Gumbel()) ({size})",
              lambda v: relax(v, Simplex(), Gumbel(), tau=0.5), torch_gs,
              lambda v: F.gumbel_softmax(v, tau=0.5), x, g, repeat,
              note="the generic entry point"),
    ]
    return rows, x, g


def run(quick: bool = False) -> list[dict]:
    dev = device()
    repeat = 9 if quick else 21
    rows, x, g = _gumbel_rows((2048, 1000), repeat)
    size = "2048x1000 f32, fwd+bwd"
    rows.append(_pair(f"gaussian_softmax ({size})", lambda v: gaussian_softmax(v, tau=0.5),
                      "torch (softmax((x + randn)/tau))",
                      lambda v: torch.softmax((v + torch.randn_like(v)) / 0.5, -1), x, g,
                      repeat, note="peer: the same math written inline, no validation"))
    try:
        import entmax
    except ImportError:
        rows.append(row(f"sparsemax ({size})", None, "entmax.sparsemax", None,
                        note="entmax not installed (pip install --no-deps entmax)"))
    else:
        rows.append(_pair(f"sparsemax ({size})", lambda v: sparsemax(v), "entmax.sparsemax",
                          lambda v: entmax.sparsemax(v, dim=-1), x, g, repeat,
                          elementwise=False))
    if not quick or dev.type == "cuda":
        del x, g
        big, _, _ = _gumbel_rows((16384, 4096), 3 if dev.type == "cpu" else repeat)
        rows += big
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
