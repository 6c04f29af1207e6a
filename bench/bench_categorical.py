"""Simplex relaxations side by side with their peers.

- ``gumbel_softmax`` (soft and hard) vs ``torch.nn.functional.gumbel_softmax``: forward +
  backward on (2048, 1000) float32 logits (the target: ratio <= 1.1).
- ``gaussian_softmax`` vs the same two lines written by hand in torch.
- ``sparsemax`` vs ``entmax.sparsemax`` (Peters et al.; skipped with a note when not installed).

Both sides run in the same process, interleaved, same inputs; times are medians.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench._timing import row, time_ms
from perturb._validation import set_validation
from perturb.categorical import gaussian_softmax, gumbel_softmax, sparsemax


def _fwd_bwd(fn, x, g):
    def step():
        x.grad = None
        fn(x).backward(g)
    return step


def _unchecked(fn, *args, **kwargs):
    with set_validation(False):
        return fn(*args, **kwargs)


def _pair(name, ours, peer_name, peer, x, g, repeat, note=""):
    ours_step, peer_step = _fwd_bwd(ours, x, g), _fwd_bwd(peer, x, g)
    # interleave to share the machine's noise fairly; keep the best median of three rounds
    o, p = [], []
    for _ in range(3):
        o.append(time_ms(ours_step, repeat=repeat))
        p.append(time_ms(peer_step, repeat=repeat))
    return row(name, min(o), peer_name, min(p), note)


def run(quick: bool = False) -> list[dict]:
    torch.manual_seed(0)
    shape = (512, 1000) if quick else (2048, 1000)
    repeat = 5 if quick else 15
    x = torch.randn(*shape, requires_grad=True)
    g = torch.randn(*shape)
    size = f"{shape[0]}x{shape[1]} f32, fwd+bwd"
    rows = [
        _pair(f"gumbel_softmax tau=0.5 ({size})", lambda v: gumbel_softmax(v, tau=0.5),
              "torch.nn.functional.gumbel_softmax", lambda v: F.gumbel_softmax(v, tau=0.5),
              x, g, repeat),
        _pair(f"gumbel_softmax, set_validation(False) ({size})",
              lambda v: _unchecked(gumbel_softmax, v, tau=0.5),
              "torch.nn.functional.gumbel_softmax", lambda v: F.gumbel_softmax(v, tau=0.5),
              x, g, repeat, note="without the finiteness check (one reduction)"),
        _pair(f"gumbel_softmax hard ({size})", lambda v: gumbel_softmax(v, 0.5, hard=True),
              "torch.nn.functional.gumbel_softmax", lambda v: F.gumbel_softmax(v, 0.5, hard=True),
              x, g, repeat),
        _pair(f"gaussian_softmax ({size})", lambda v: gaussian_softmax(v, tau=0.5),
              "torch (softmax((x + randn)/tau))",
              lambda v: torch.softmax((v + torch.randn_like(v)) / 0.5, -1), x, g, repeat,
              note="peer: the same math written inline, no validation"),
    ]
    try:
        import entmax
    except ImportError:
        rows.append(row(f"sparsemax ({size})", None, "entmax.sparsemax", None,
                        note="entmax not installed (pip install --no-deps entmax)"))
    else:
        rows.append(_pair(f"sparsemax ({size})", lambda v: sparsemax(v), "entmax.sparsemax",
                          lambda v: entmax.sparsemax(v, dim=-1), x, g, repeat))
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
