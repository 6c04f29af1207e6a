"""Gumbel boxes: intersection + log volume, forward and backward, against box-embeddings; and
the box-hierarchy trainer's epoch.

Workload: 65,536 pairs of 32-d boxes (float32); the Gumbel intersection of each pair and the
log of its expected volume, summed, then backward to both boxes' corners. The peer is the
``box-embeddings`` library (``GumbelIntersection`` + ``BesselApproxVolume``), which uses the
softplus approximation of the Bessel volume; we compare against our ``approx=True`` path
(same formula, same temperatures) and report separately what the exact Bessel volume costs.

Trainer rows (issue 14): one epoch of ``train_hierarchy`` over the WordNet noun hierarchy's
edges (84,427 ``@``/``@i`` edges, 82,115 boxes; batch 512, 10 negatives per positive, d = 10,
Gumbel boxes), the median epoch time over a few epochs, against the epoch recorded before the
Gumbel volume read its Bessel functions from a polynomial table (commit 0461c72,
:data:`PREV_EPOCH_MS`, same 2-core machine); the trainer before the device-resident rewrite
(commit 05c18ae, :data:`OLD_EPOCH_MS`) is quoted in the note. Without WordNet the rows use a
random tree of the same size. Host synchronisations and aten ops are counted on one training
step.

Peer-loop rows (issue 29): the same epoch against the loop a box-embeddings user writes by hand
(:mod:`bench._box_peer`: ``BoxTensor``, ``GumbelIntersection``, ``BesselApproxVolume``, Adam,
unfiltered uniform negatives), started from the same boxes, same batch, negatives, d and
scales, timed in alternation with ours in the same process (medians); also ours without
diagnostics (``diagnostics_every=0``) and the peer loop with our exact Bessel volume. Ours
scores a batch's pairs in one autograd node (:mod:`perturb.boxes._gumbel_pairs`: log P with an
analytic backward, the nested-negative log(1 − P) fused on its candidate rows).
"""
from __future__ import annotations

import statistics
import time

import torch

from bench._timing import count_ops, count_syncs, device, gc_paused, row, time_interleaved, time_ms
from perturb._validation import set_validation
from perturb.boxes import Box, intersection, volume

BETA = 0.1
#: The old trainer's epoch (batch 512, WordNet nouns) on this 2-core machine: median of 5
#: epochs measured on 2026-11-23 (3.8–6.4 s, machine shared; the issue recorded 5.0–7.7 s).
OLD_EPOCH_MS = 6000.0
#: The epoch before the K0 table (commit 0461c72, WordNet nouns, 2 threads, quiet machine, as
#: recorded in bench/RESULTS.md on 2026-11-23): batch 512 and 4096.
PREV_EPOCH_MS = {512: 2230.0, 4096: 1520.0}


def _data(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for _ in range(2):
        lo = torch.rand(n, d, generator=g)
        hi = lo + 0.5 * torch.rand(n, d, generator=g)
        tensors += [lo, hi]
    return tuple(t.requires_grad_() for t in tensors)


def _ours(lo_a, hi_a, lo_b, hi_b, approx: bool) -> torch.Tensor:
    inter = intersection(Box(lo_a, hi_a), Box(lo_b, hi_b), beta=BETA)
    return volume(inter, beta=BETA, approx=approx, log=True)


def _peer_fns():
    from box_embeddings.modules.intersection import GumbelIntersection
    from box_embeddings.modules.volume import BesselApproxVolume
    from box_embeddings.parameterizations.box_tensor import BoxTensor

    inter = GumbelIntersection(intersection_temperature=BETA)
    vol = BesselApproxVolume(log_scale=True, volume_temperature=BETA,
                             intersection_temperature=BETA)

    def peer(lo_a, hi_a, lo_b, hi_b):
        a = BoxTensor.from_zZ(lo_a, hi_a)
        b = BoxTensor.from_zZ(lo_b, hi_b)
        return vol(inter(a, b))

    return peer


def _fwd_bwd(fn, tensors):
    def step():
        for t in tensors:
            t.grad = None
        fn(*tensors).sum().backward()
    return step


def _hierarchy_graph():
    from perturb.boxes.hierarchy import random_tree, wordnet_dir, wordnet_noun_hierarchy
    if (wordnet_dir() / "data.noun").is_file() and (wordnet_dir() / "index.noun").is_file():
        g = wordnet_noun_hierarchy()
        return g, f"WordNet nouns, {g.number_of_edges():,} edges, {g.number_of_nodes():,} boxes"
    g = random_tree(82115, seed=0)
    return g, (f"random tree standing in for WordNet (not installed), {g.number_of_edges():,} "
               f"edges, {g.number_of_nodes():,} boxes")


def _trainer_rows(quick: bool) -> list[dict]:
    from perturb.boxes.hierarchy import (BoxHierarchyModel, HierarchyConfig, Trainer,
                                         edge_index, train_hierarchy)
    from perturb.boxes.losses import PairSet
    graph, what = _hierarchy_graph()
    dev = device()
    epochs = 2 if quick else 4
    rows = []
    for batch in (512, 4096):
        cfg = HierarchyConfig(dim=10, epochs=epochs, batch_size=batch, negatives_per_positive=10,
                              closure=False, seed=0)
        res = train_hierarchy(graph, config=cfg, device=dev, progress=False)
        secs = res.history.seconds[1:] if len(res.history.seconds) > 1 else res.history.seconds
        epoch_ms = 1e3 * statistics.median(secs)
        steps = len(res.history.step_loss) // epochs
        # host synchronisations of one step (diagnostics off, the common step)
        n = graph.number_of_nodes()
        pos = edge_index(graph).to(dev)
        model = BoxHierarchyModel(n, device=dev, **cfg.model_kwargs())
        trainer = Trainer(model, pos, PairSet(pos, n, include_self=True), cfg,
                          torch.Generator(device=dev).manual_seed(0))

        def one_step():
            with set_validation(False):
                trainer.step(pos[:batch])
        syncs = count_syncs(one_step)
        ops = count_ops(one_step)
        old = (f"; the trainer before the rewrite (05c18ae) took {OLD_EPOCH_MS / 1e3:.1f} s"
               if batch == 512 else "")
        rows.append(row(f"hierarchy trainer epoch ({what}; batch {batch}, 10 negatives, d=10, "
                        f"Gumbel, {dev.type})", epoch_ms,
                        "before the K0 table (0461c72), recorded", PREV_EPOCH_MS[batch],
                        syncs=syncs, ops=ops,
                        note=f"{steps} steps, {steps / (epoch_ms / 1e3):.0f} steps/s; "
                             f"{_SYNC_NOTE}{old}"))
    return rows


#: What the sync column counts for the trainer (aten::_local_scalar_dense) and what it does not.
_SYNC_NOTE = ("syncs/step: the CPU fused Adam's reads of its step counter (the peer's 2 too); "
              "not counted there, host reads that no aten op makes: one tolist of the Bessel "
              "regime flags per table evaluation (1–2) and a nonzero each in the sampler and the "
              "nested-negative candidates (all branch-free where reads stall: CUDA, compile)")


def _floor_scorer(model):
    """A pair score with the shapes of the Gumbel one and none of its work (the same gathered
    boxes, a width sum): a trainer using it measures the rest of a step, the floor under any
    faster pair score (sampler, gathers, gradient scatter, Adam)."""
    from perturb.boxes.hierarchy.model import PairScores

    def score(child, parent, n_pos, validate=False):
        box = model.gather(torch.cat([child, parent]), validate=False)
        w = (box.upper - box.lower).sum(-1)
        n = child.shape[0]
        log_p = (w[:n] - w[n:]).clamp(max=0.0) * 1e-3
        return PairScores(log_p, log_p[n_pos:] - 1.0)
    return score


def _cpu_step_ms(fns: dict, batches: list, skip: int = 10) -> dict[str, float]:
    """Median CPU time (``time.thread_time``) of one step of each function, called in
    alternation on the same batches (order reversed every other batch; no garbage
    collection inside the loop). On a shared machine
    CPU time is much steadier than wall time, which counts the waits for a core."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    with gc_paused():
        for i, b in enumerate(batches):
            for k in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
                t0 = time.thread_time()
                fns[k](b)
                if i >= skip:
                    times[k].append(time.thread_time() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def _peer_loop_rows(quick: bool) -> list[dict]:
    """One epoch of our trainer against the hand-written box-embeddings loop (issue 29)."""
    from bench._box_peer import PeerLoop
    from perturb.boxes.hierarchy import HierarchyConfig, Trainer, edge_index, initial_model
    from perturb.boxes.losses import PairSet
    from perturb.noise import Gumbel
    dev = device()
    if dev.type != "cpu":
        return []                                 # the peer loop runs on the CPU only
    graph, what = _hierarchy_graph()
    batch, k, dim, beta, vbeta = 512, 10, 10, 0.01, 0.1
    cfg = HierarchyConfig(noise=Gumbel(scale=beta), volume_beta=vbeta, dim=dim,
                          batch_size=batch, negatives_per_positive=k, closure=False, seed=0)
    n = graph.number_of_nodes()
    pos = edge_index(graph)
    known = PairSet(pos, n, include_self=True)

    def ours(config):
        model = initial_model(n, list(graph.nodes), config, pos, torch.Generator().manual_seed(0))
        return Trainer(model, pos, known, config, torch.Generator().manual_seed(1))
    trainer, plain = ours(cfg), ours(cfg.replace(diagnostics_every=0))
    lazy = ours(cfg.replace(optimizer="sparse_adam"))
    lazy_plain = ours(cfg.replace(optimizer="sparse_adam", diagnostics_every=0))
    e = trainer.model.embedding
    peers = {v: PeerLoop(e.param1, e.param2, pos, beta=beta, volume_beta=vbeta, batch_size=batch,
                         negatives=k, lr=cfg.lr, volume=v) for v in ("approx", "exact")}
    peers["sparse"] = PeerLoop(e.param1, e.param2, pos, beta=beta, volume_beta=vbeta,
                               batch_size=batch, negatives=k, lr=cfg.lr, sparse=True)
    # quick: the first 30 batches of an epoch (each side), else whole epochs
    steps = 30 if quick else None
    if steps is None:
        fns = {"ours": trainer.run_epoch, "plain": plain.run_epoch,
               "lazy": lazy.run_epoch, "lazy_plain": lazy_plain.run_epoch,
               "approx": peers["approx"].run_epoch, "exact": peers["exact"].run_epoch,
               "sparse": peers["sparse"].run_epoch}
    else:
        order = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(2))
        chunks = order[:steps * batch].split(batch)

        def loop(tr, diag_every):
            def go():
                with set_validation(False):
                    for s, idx in enumerate(chunks):
                        tr.step(pos[idx], bool(diag_every) and s % diag_every == 0)
            return go
        fns = {"ours": loop(trainer, cfg.diagnostics_every), "plain": loop(plain, 0),
               "lazy": loop(lazy, cfg.diagnostics_every), "lazy_plain": loop(lazy_plain, 0),
               "approx": lambda: peers["approx"].run_epoch(steps),
               "exact": lambda: peers["exact"].run_epoch(steps),
               "sparse": lambda: peers["sparse"].run_epoch(steps)}
    ms = time_interleaved(fns, repeat=3 if quick else 5, warmup=1)
    per_epoch = -(-pos.shape[0] // batch)
    span = f"{steps} steps" if steps else f"one epoch, {per_epoch} steps"

    def peer_step():
        peers["approx"].step(pos[:batch])

    def our_step():
        with set_validation(False):
            plain.step(pos[:batch])
    def lazy_step():
        with set_validation(False):
            lazy_plain.step(pos[:batch])
    ops = {"ours": count_ops(our_step), "peer": count_ops(peer_step),
           "lazy": count_ops(lazy_step)}
    syncs = {"ours": count_syncs(our_step), "peer": count_syncs(peer_step)}
    # CPU time per step, interleaved step by step, after the timed epochs (nested negatives
    # present): ours without diagnostics, the floor (ours with a free pair score), the peer
    floor = ours(cfg.replace(diagnostics_every=0))
    floor.scorer = _floor_scorer(floor.model)
    perm = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(3))
    step_batches = [pos[i] for i in perm.split(batch)][:40 if quick else 160]
    with set_validation(False):
        cpu = _cpu_step_ms({"ours": lambda b: plain.step(b), "floor": lambda b: floor.step(b),
                            "peer": peers["approx"].step}, step_batches)
    n_cpu = len(step_batches) - 10
    setting = (f"{what}; batch {batch}, {k} negatives, d={dim}, Gumbel β={beta}, "
               f"β_vol={vbeta}, {span}")
    peer_name = "box-embeddings 0.1.0 hand-written loop (BesselApproxVolume, Adam)"
    epoch_note = ("ours: exact Bessel volume, negatives filtered against the known pairs, "
                  "nested-pair log(1 − P), end-of-epoch quantiles and accuracy" if not steps
                  else "ours: exact Bessel volume, filtered negatives, nested-pair log(1 − P)")
    return [
        row(f"trainer vs hand-written peer loop ({setting})", ms["ours"], peer_name,
            ms["approx"], ops=ops["ours"], syncs=syncs["ours"],
            note=f"{epoch_note}; diagnostics every {cfg.diagnostics_every} steps; peer "
                 f"{ops['peer']} ops, {syncs['peer']} syncs per step; ops and syncs of a step "
                 f"after the timed epochs (nested negatives present); {_SYNC_NOTE}; "
                 f"before issue 29's fused pair score (6cb82aa): 1.38×, 468 ops, 8 syncs"),
        row(f"same, diagnostics_every=0 ({setting})", ms["plain"], peer_name, ms["approx"],
            note="cost of the diagnostics = difference to the row above; before (6cb82aa): "
                 "1.32×"),
        row(f"same, peer loop with our exact Bessel volume ({setting})", ms["plain"],
            "box-embeddings loop, volume = perturb exact", ms["exact"],
            note="ours without diagnostics; separates the volume's cost from the loop's; "
                 "before (6cb82aa): 1.08×"),
        row(f"trainer, optimizer='sparse_adam', vs hand-written peer loop ({setting})",
            ms["lazy"], peer_name, ms["approx"], ops=ops["lazy"],
            note=f"lazy Adam (SparseAdam's rule: only the step's boxes move, their moments only "
                 f"decay when touched; a different algorithm) on sparse COO row gradients; "
                 f"diagnostics every {cfg.diagnostics_every} steps; the dense-Adam trainer of "
                 f"the first row: {ms['ours']:.0f} ms"),
        row(f"same, sparse_adam, diagnostics_every=0 ({setting})", ms["lazy_plain"], peer_name,
            ms["approx"], note=f"the dense-Adam trainer without diagnostics: "
                               f"{ms['plain']:.0f} ms (second row)"),
        row(f"same, sparse_adam vs the peer loop with SparseAdam ({setting})", ms["lazy_plain"],
            "box-embeddings loop, F.embedding(sparse=True) + torch.optim.SparseAdam",
            ms["sparse"], note="both lazy, same update rule; ours without diagnostics"),
        row(f"one step, CPU time (thread_time), diagnostics_every=0 ({what}; batch {batch}, "
            f"{k} negatives, d={dim}, Gumbel β={beta}, β_vol={vbeta})", cpu["ours"], peer_name,
            cpu["peer"], note=f"medians of {n_cpu} steps taken in alternation with the peer's "
                              f"on the same batches, after the timed epochs; CPU time, not wall "
                              f"time, so that a shared machine's waits for a core do not count"),
        row(f"the floor of a step: ours with a free pair score, CPU time ({what}; batch "
            f"{batch}, {k} negatives, d={dim})", cpu["floor"], peer_name, cpu["peer"],
            note=f"the same trainer with a width sum in place of the Gumbel pair score "
                 f"(bench_boxes._floor_scorer): sampler, gathers, gradient scatter, Adam; no "
                 f"pair score can take a step below it; our step's Gumbel-specific part = "
                 f"{cpu['ours'] - cpu['floor']:.1f} ms"),
    ]


def run(quick: bool = False) -> list[dict]:
    n, d = (8192, 32) if quick else (65536, 32)
    repeat = 3 if quick else 10
    torch.manual_seed(0)
    tensors = _data(n, d)
    size = f"{n} pairs, d={d}, float32, β={BETA}"
    rows = []

    ours_approx = time_ms(_fwd_bwd(lambda *t: _ours(*t, approx=True), tensors), repeat=repeat)
    ours_exact = time_ms(_fwd_bwd(lambda *t: _ours(*t, approx=False), tensors), repeat=repeat)
    ours_fwd = time_ms(lambda: _ours(*(t.detach() for t in tensors), approx=True),
                       repeat=repeat)
    with set_validation(False):
        ours_noval = time_ms(_fwd_bwd(lambda *t: _ours(*t, approx=True), tensors),
                             repeat=repeat)

    try:
        peer = _peer_fns()
    except Exception as e:  # the peer could not be imported
        rows.append(row(f"Gumbel ∩ + log volume fwd+bwd ({size})", ours_approx, "box-embeddings",
                        None, note=f"box-embeddings unavailable: {type(e).__name__}: {e}"))
    else:
        with torch.no_grad():
            ours_v = _ours(*tensors, approx=True)
            peer_v = peer(*tensors)
        diff = (ours_v - peer_v).abs().max().item()
        peer_ms = time_ms(_fwd_bwd(peer, tensors), repeat=repeat)
        peer_fwd = time_ms(lambda: peer(*(t.detach() for t in tensors)), repeat=repeat)
        rows.append(row(f"Gumbel ∩ + log volume (softplus approx) fwd+bwd ({size})", ours_approx,
                        "box-embeddings 0.1.0 GumbelIntersection+BesselApproxVolume", peer_ms,
                        note=f"same formula; largest log-volume difference {diff:.2g}"))
        rows.append(row(f"Gumbel ∩ + log volume (softplus approx) forward only ({size})",
                        ours_fwd, "box-embeddings 0.1.0 GumbelIntersection+BesselApproxVolume",
                        peer_fwd, note="no grad; includes our NaN check of the 4 corner tensors"))
        rows.append(row(f"same fwd+bwd, perturb.set_validation(False) ({size})", ours_noval,
                        "box-embeddings 0.1.0 GumbelIntersection+BesselApproxVolume", peer_ms,
                        note="without the NaN check of the inputs (box-embeddings has none)"))
    rows.append(row(f"exact Bessel log volume vs our softplus approx, fwd+bwd ({size})",
                    ours_exact, "perturb approx=True", ours_approx,
                    note="cost of the exact K0 volume (log K0 and its slope from the polynomial "
                         "table, per element and function one 1-D gather per power of s and 3 "
                         "fused multiply-adds in float32)"))
    try:
        import box_embeddings  # noqa: F401
    except ImportError:
        return rows + _trainer_rows(quick)
    return rows + _trainer_rows(quick) + _peer_loop_rows(quick)


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
