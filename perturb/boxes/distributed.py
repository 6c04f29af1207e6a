"""Data-parallel training of hierarchy box embeddings over several processes (DDP).

:func:`train_hierarchy_distributed` is :func:`~perturb.boxes.hierarchy.train_hierarchy` run by
``world_size`` processes started with ``torch.multiprocessing.spawn``:

- every process builds the same initial boxes (same seed) and wraps the scorer in
  ``torch.nn.parallel.DistributedDataParallel`` (backend ``"gloo"`` on CPU, ``"nccl"`` for CUDA);
- the positive edges are shuffled once with the common seed and sharded round-robin, rank r
  taking edges ``r, r + W, r + 2W, ...``; each rank shuffles its shard every epoch and draws its
  own negatives (rank-specific generator);
- every rank makes the same number of steps per epoch (its shard split into
  ``ceil(m / (W · batch_size))`` nearly equal batches), so the gradient all-reduces match up;
  DDP averages the gradients, so a step is a step on the union of the W batches (with equal
  batch sizes, the mean loss over ``W · batch_size`` positives);
- rank 0 writes its parameters (identical on every rank) and history to a temporary file that
  the calling process reads back.

Use it for graphs whose closure has millions of edges (the WordNet noun closure has 743,241):
with W processes, an epoch costs about 1/W of the single-process one plus one all-reduce of the
``(num_nodes, 2·dim)`` gradient per step.
"""
from __future__ import annotations

import math
import os
import socket
import tempfile
import time
from typing import Any, Sequence

import networkx as nx
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from perturb._validation import check_choice, check_int
from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    TrainHistory,
    TrainResult,
    _end_epoch,
    _known_codes,
    _prepare,
    _StepConfig,
    _train_step,
)

__all__ = ["train_hierarchy_distributed", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Scorer(nn.Module):
    """``forward(child, parent) = model.log_containment_pair(child, parent)``, so that DDP sees
    the call (DDP hooks its gradient all-reduce on a forward through the wrapper)."""

    def __init__(self, model: BoxHierarchyModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, child: torch.Tensor, parent: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.log_containment_pair(child, parent)


def _shard(pos: torch.Tensor, rank: int, world_size: int, seed: int) -> torch.Tensor:
    perm = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(seed))
    return pos[perm[rank::world_size]]


def _worker(rank: int, world_size: int, cfg: dict, out_path: str) -> None:
    """One DDP process: train on shard ``rank`` and, on rank 0, save the result."""
    torch.set_num_threads(cfg["threads"])
    init = f"tcp://{cfg['master_addr']}:{cfg['master_port']}"
    dist.init_process_group(cfg["backend"], init_method=init, rank=rank, world_size=world_size)
    try:
        device = cfg["device"]
        if device is not None and torch.device(device).type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
        model = BoxHierarchyModel(**cfg["model_kwargs"], generator=torch.Generator().manual_seed(
            cfg["seed"]), device=device)
        if cfg["init_state"] is not None:
            model.load_state_dict(cfg["init_state"])
        scorer = _Scorer(model)
        ddp = nn.parallel.DistributedDataParallel(
            scorer, device_ids=None if model.embedding.param1.device.type == "cpu"
            else [model.embedding.param1.device])
        pos = cfg["pos"]
        shard = _shard(pos, rank, world_size, cfg["seed"])
        n_steps = max(1, math.ceil(pos.shape[0] / (world_size * cfg["batch_size"])))
        gen = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + 7919 * (rank + 1))
        step_cfg = _StepConfig(model.num_nodes, cfg["k"], cfg["known_codes"],
                               cfg["negative_weight"], cfg["volume_reg"],
                               cfg["volume_threshold"], cfg["grad_tol"])
        opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
        hist = TrainHistory()
        acc_sample = pos[:65536]
        for epoch in range(cfg["epochs"]):
            t0 = time.perf_counter()
            model.train()
            perm = torch.randperm(shard.shape[0], generator=gen)
            steps = [_train_step(model, ddp, opt, shard[idx], step_cfg, gen)
                     for idx in torch.tensor_split(perm, n_steps)]
            # report the step metrics averaged over the ranks
            t = torch.tensor(steps, dtype=torch.float64).reshape(len(steps), -1)
            dist.all_reduce(t)
            steps = [tuple(r) for r in (t / world_size).tolist()]
            if rank == 0:
                _end_epoch(model, hist, steps, acc_sample, cfg["accuracy_threshold"], epoch,
                           cfg["epochs"], None, 0, t0, None)
        if rank == 0:
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            torch.save({"state_dict": state, "history": hist.__dict__}, out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def train_hierarchy_distributed(graph: nx.DiGraph, dim: int, method: str = "gumbel", *,
                                world_size: int = 2, backend: str | None = None,
                                master_addr: str = "127.0.0.1", master_port: int | None = None,
                                beta: float = 0.01, volume_beta: float | None = 0.1,
                                temperature: float = 0.1, epochs: int = 100, lr: float = 0.05,
                                negatives_per_positive: int = 10, batch_size: int = 512,
                                negative_weight: float = 1.0, volume_reg: float = 0.0,
                                volume_threshold: float = 0.5, train_edges: Any = None,
                                closure: bool = True, known_edges: torch.Tensor | None = None,
                                parameterisation: str = "center_offset",
                                init: float | Sequence[float] = (0.1, 0.5), seed: int = 0,
                                device: str | None = None, dtype: torch.dtype = torch.float32,
                                grad_tol: float = 1e-12, accuracy_threshold: float = 0.5,
                                threads_per_process: int = 1,
                                model: BoxHierarchyModel | None = None) -> TrainResult:
    """:func:`~perturb.boxes.hierarchy.train_hierarchy` on ``world_size`` DDP processes.

    Arguments shared with ``train_hierarchy`` mean the same; ``batch_size`` is per process (a
    step sees ``world_size · batch_size`` positives). The initial boxes are those that
    ``train_hierarchy(..., seed=seed)`` starts from.

    Args:
        world_size: number of processes (>= 1).
        backend: ``"gloo"`` (default on CPU) or ``"nccl"`` (default with a CUDA ``device``;
            process r uses GPU ``r mod device_count``).
        master_addr, master_port: the rendezvous address; default port: a free one
            (:func:`free_port`).
        threads_per_process: ``torch.set_num_threads`` in each worker.
        model: continue training this model (its boxes and box model; ``method``, ``beta``...
            and ``init`` are then ignored), e.g. for a learning-rate schedule in phases.

    Returns:
        :class:`~perturb.boxes.hierarchy.TrainResult`: the model (on CPU, holding rank 0's
        parameters) and rank 0's history, whose ``loss`` and ``zero_grad_fraction`` are
        averaged over the ranks (``eval`` is empty: evaluate the returned model).

    Raises:
        ValueError: as ``train_hierarchy``; ``world_size < 1``; an unknown backend.
        RuntimeError: a worker failed (its traceback is included).

    Example:
        >>> from perturb.boxes.datasets import balanced_tree
        >>> res = train_hierarchy_distributed(balanced_tree(2, 3), 2, world_size=2,
        ...                                   epochs=3)                     # doctest: +SKIP
    """
    check_int(world_size, "world_size", low=1)
    n, pos, _ = _prepare(graph, dim, epochs, negatives_per_positive, batch_size, lr, 0,
                         volume_reg, negative_weight, None, seed, train_edges, closure)
    if backend is None:
        backend = "nccl" if device is not None and torch.device(device).type == "cuda" \
            else "gloo"
    check_choice(backend, ("gloo", "nccl", "mpi"), "backend")
    init_state = None
    if model is not None:
        if model.num_nodes != n or model.dim != dim:
            raise ValueError(f"model has {model.num_nodes} boxes of dim {model.dim}, the graph "
                             f"needs {n} of dim {dim}")
        method, beta, volume_beta = model.method, model.beta, model.volume_beta
        temperature, parameterisation = model.temperature, model.embedding.parameterisation
        dtype = model.embedding.param1.dtype
        init_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    model_kwargs = dict(num_nodes=n, dim=dim, method=method, beta=beta, volume_beta=volume_beta,
                        temperature=temperature, nodes=list(graph.nodes),
                        parameterisation=parameterisation, init=init, dtype=dtype)
    BoxHierarchyModel(**model_kwargs)              # validate the model arguments here
    cfg = dict(model_kwargs=model_kwargs, init_state=init_state, seed=int(seed),
               device=device, backend=backend,
               master_addr=master_addr,
               master_port=master_port if master_port is not None else free_port(master_addr),
               pos=pos, known_codes=_known_codes(pos, known_edges, n),
               k=negatives_per_positive, batch_size=batch_size, epochs=epochs, lr=lr,
               negative_weight=negative_weight, volume_reg=volume_reg,
               volume_threshold=volume_threshold, grad_tol=grad_tol,
               accuracy_threshold=accuracy_threshold, threads=threads_per_process)
    with tempfile.TemporaryDirectory(prefix="perturb_ddp_") as tmp:
        out_path = os.path.join(tmp, "rank0.pt")
        mp.spawn(_worker, args=(world_size, cfg, out_path), nprocs=world_size, join=True)
        saved = torch.load(out_path, weights_only=False)
    model = BoxHierarchyModel(**model_kwargs)
    model.load_state_dict(saved["state_dict"])
    model.eval()
    return TrainResult(model, TrainHistory(**saved["history"]))
