"""Tests for perturb.boxes.hierarchy.distributed: 2 DDP processes (gloo, CPU) on a tiny
hierarchy; the backend choice (NCCL for CUDA) by construction."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from perturb.noise import Gumbel
from perturb.boxes.hierarchy import (balanced_tree, free_port, train_hierarchy,
                                     train_hierarchy_distributed)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_two_processes_match_single_process_full_batch():
    """Without negatives, 2 ranks x (half of the edges) with DDP's gradient averaging take the
    same Adam steps as one process on the full batch: equal parameters after training."""
    g = balanced_tree(2, 3)                  # 15 nodes, closure of 34 edges: shards of 17
    kw = dict(noise=Gumbel(0.2), epochs=4, lr=0.05, negatives_per_positive=0, seed=3,
              dtype=torch.float64)
    dist_res = train_hierarchy_distributed(g, 2, world_size=2, batch_size=17, **kw)
    single = train_hierarchy(g, 2, batch_size=34, progress=False, **kw)
    for name, p in single.model.named_parameters():
        torch.testing.assert_close(dist_res.model.get_parameter(name), p, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(torch.tensor(dist_res.history.loss),
                               torch.tensor(single.history.loss), rtol=1e-9, atol=1e-10)
    assert dist_res.model.nodes == list(g.nodes)
    h = dist_res.history
    assert len(h.loss) == len(h.volume_quantiles) == len(h.containment_accuracy) == 4
    assert h.loss[-1] < h.loss[0]
    assert all(0.0 <= z <= 1.0 for z in h.zero_grad_fraction)
    assert len(h.epoch_stalled_fraction) == len(h.epoch_violated_fraction) == 4
    # a second phase (lower lr) continuing from the trained model: still equal
    more = train_hierarchy_distributed(g, 2, world_size=2, batch_size=17, model=dist_res.model,
                                       **{**kw, "lr": 0.01, "epochs": 2})
    single2 = train_hierarchy(g, 2, batch_size=34, progress=False, model=single.model,
                              **{**kw, "lr": 0.01, "epochs": 2})
    for name, p in single2.model.named_parameters():
        torch.testing.assert_close(more.model.get_parameter(name), p, rtol=1e-9, atol=1e-10)


def test_nested_start_is_the_same_in_every_process():
    """initializer="nested": each rank builds the boxes of train_hierarchy from the shared
    seed, so 2 ranks still match one process on the full batch."""
    g = balanced_tree(2, 3)
    kw = dict(noise=Gumbel(0.2), epochs=2, lr=0.05, negatives_per_positive=0, seed=3,
              dtype=torch.float64, initializer="nested")
    dist_res = train_hierarchy_distributed(g, 2, world_size=2, batch_size=17, **kw)
    single = train_hierarchy(g, 2, batch_size=34, progress=False, **kw)
    start = train_hierarchy(g, 2, batch_size=34, progress=False, **{**kw, "epochs": 0})
    for name, p in single.model.named_parameters():
        torch.testing.assert_close(dist_res.model.get_parameter(name), p, rtol=1e-9, atol=1e-10)
        assert not torch.equal(p, start.model.get_parameter(name))      # it trained
    box = start.model.embedding.all_boxes()                 # and started nested
    assert bool((box.lower[1:] > box.lower[(torch.arange(1, 15) - 1) // 2]).all())


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, world_size=0)
    with pytest.raises(ValueError, match="backend"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, backend="tcp")
    with pytest.raises(ValueError, match="nccl"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, backend="nccl")
    with pytest.raises(ValueError, match="optimizer='sparse_adam'"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, optimizer="sparse_adam")


def test_backend_selection():
    from perturb.boxes.hierarchy import select_backend
    assert select_backend("cuda") == "nccl" and select_backend(torch.device("cuda", 1)) == "nccl"
    assert select_backend(None) == "gloo" and select_backend("cpu") == "gloo"
    assert select_backend("cuda", "gloo") == "gloo"
    with pytest.raises(ValueError, match="nccl.*CUDA"):
        select_backend("cpu", "nccl")
    with pytest.raises(ValueError, match="backend"):
        select_backend("cpu", "tcp")


def test_distributed_checkpoint_resume(tmp_path):
    """2 processes, interrupted after 2 epochs (a shorter run with the same config), resumed to
    4: the same parameters as 4 epochs in one go (every rank's generator is restored)."""
    g = balanced_tree(2, 3)
    kw = dict(noise=Gumbel(0.2), lr=0.05, negatives_per_positive=2, seed=3, batch_size=8,
              dtype=torch.float64, world_size=2)
    straight = train_hierarchy_distributed(g, 2, epochs=4, **kw)
    path = tmp_path / "ddp.ckpt"
    train_hierarchy_distributed(g, 2, epochs=2, checkpoint=path, **kw)
    resumed = train_hierarchy_distributed(g, 2, epochs=4, checkpoint=path, resume=True, **kw)
    for name, p in straight.model.state_dict().items():
        q = resumed.model.state_dict()[name]
        assert (torch.equal(q, p) if isinstance(p, torch.Tensor) else q == p), name
    assert resumed.history.loss == straight.history.loss
    with pytest.raises(ValueError, match="written by 2 processes, not 1"):
        train_hierarchy_distributed(g, 2, epochs=4, checkpoint=path, resume=True,
                                    **{**kw, "world_size": 1})


def test_worker_failure_is_reported_not_hung(tmp_path, monkeypatch):
    """A process that fails after DDP's first collectives (here: a checkpoint that cannot be
    written) ends the job with its traceback, in both processes' time, not a hang."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(RuntimeError, match="training process failed"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, epochs=1, world_size=2, seed=0,
                                    checkpoint=blocked / "x.ckpt", timeout=60)


def test_timeout_is_checked():
    with pytest.raises(ValueError, match="timeout"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, timeout=0)


_TORCHRUN_JOB = """
import os, sys, torch
from perturb.boxes.hierarchy import balanced_tree, train_hierarchy_distributed
from perturb.noise import Gumbel
res = train_hierarchy_distributed(balanced_tree(2, 3), 2, Gumbel(0.2), epochs=3,
                                  lr=0.05, negatives_per_positive=0, batch_size=17, seed=3,
                                  dtype=torch.float64, timeout=120)
torch.save({"params": dict(res.model.named_parameters()), "loss": res.history.loss},
           os.path.join(sys.argv[1], "rank%s.pt" % os.environ["RANK"]))
"""


def test_torchrun_two_gloo_processes(tmp_path):
    """The documented launch: `torchrun --standalone --nproc-per-node 2 job.py`, each process
    calling train_hierarchy_distributed (env:// rendezvous): both return the same model, and
    it is the model of one process on the full batch."""
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_TORCHRUN_JOB))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    from perturb.boxes.hierarchy.distributed import _loopback_interface
    if _loopback_interface() is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(job), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    single = train_hierarchy(balanced_tree(2, 3), 2, Gumbel(0.2), epochs=3,
                             lr=0.05, negatives_per_positive=0, batch_size=34, seed=3,
                             dtype=torch.float64, progress=False)
    for name, p in single.model.named_parameters():
        assert torch.equal(r0["params"][name], r1["params"][name]), name
        torch.testing.assert_close(r0["params"][name], p.detach(), rtol=1e-9, atol=1e-10)
    assert r0["loss"] == r1["loss"] and len(r0["loss"]) == 3


def test_world_size_must_match_torchrun(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="torchrun started 2"):
        train_hierarchy_distributed(balanced_tree(2, 2), 2, world_size=3)
