"""Data-parallel training of hierarchy box embeddings over several processes (DDP).

:func:`train_hierarchy_distributed` is :func:`~perturb.boxes.hierarchy.train_hierarchy` run by
``world_size`` processes, launched by ``torchrun`` (each process calls it and joins the
``env://`` group) or started by the function itself with ``torch.multiprocessing.spawn``
(meeting through a file rendezvous, no TCP port), with the same
:class:`~perturb.boxes.hierarchy.HierarchyConfig` and the same epoch loop
(:class:`~perturb.boxes.hierarchy.Trainer`):

- the backend is NCCL when the model is on CUDA (process r on GPU ``r mod device_count``) and
  gloo on the CPU (:func:`select_backend`);
- every process builds the same initial boxes (``config.seed``) and wraps the scorer in
  ``torch.nn.parallel.DistributedDataParallel``;
- the positive edges are shuffled once with the seed and sharded round-robin; each rank
  shuffles its shard every epoch and draws its own negatives (its own generator);
- every rank makes the same number of steps per epoch (its shard split into
  ``ceil(m / (W · batch_size))`` nearly equal batches), so the gradient all-reduces match up;
  DDP averages the gradients, so a step is a step on the union of the W batches;
- the epoch's metrics are averaged over the ranks (one all-reduce per epoch);
- checkpoints (``checkpoint=``) hold the parameters and optimizer state (identical on every
  rank) and every rank's generator state, written by rank 0; ``resume=True`` continues with the
  same world size;
- spawned: rank 0 writes the final parameters and history to a temporary file that the caller
  reads; under torchrun every process returns its own (identical) model;
- collectives wait at most ``timeout`` seconds; a spawned process that fails reports its
  traceback; spawned processes exit without tearing down their group (which can deadlock with
  work in flight, see ``_worker``).

Under torchrun (one process per GPU or CPU worker)::

    torchrun --standalone --nproc-per-node 4 train_nouns.py   # each calls the function

Multi-GPU (one process per GPU, NCCL)::

    res = train_hierarchy_distributed(nouns, config, world_size=torch.cuda.device_count(),
                                      device="cuda")

or from the command line ``python examples/box_hierarchy.py --full-wordnet --device cuda
--world-size 4``.
"""
from __future__ import annotations

import datetime
import glob
import math
import os
import socket
import sys
import tempfile
import traceback
from typing import Any

import networkx as nx
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from perturb._validation import check_choice, check_int, check_positive
from perturb.boxes.hierarchy.config import HierarchyConfig
from perturb.boxes.hierarchy.graphs import check_pairs
from perturb.boxes.hierarchy.io import atomic_save, checkpoint_header, load_checkpoint
from perturb.boxes.hierarchy.model import BoxHierarchyModel, PairScores
from perturb.boxes.hierarchy.rng import resolve_generator
from perturb.boxes.hierarchy.training import (Trainer, TrainHistory, TrainResult,
                                              initial_model, resolve_config, training_pairs)
from perturb.boxes.losses import PairSet
from perturb.noise import Noise

__all__ = ["train_hierarchy_distributed", "free_port", "select_backend", "BACKENDS"]

#: Backends accepted by :func:`train_hierarchy_distributed`.
BACKENDS = ("gloo", "nccl", "mpi")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (bind to port 0 and read it back).

    Free *now* only: another process may take it before it is used. The trainer does not
    use it (file or ``env://`` rendezvous); it is for a ``master_port`` chosen by hand."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def select_backend(device: torch.device | str | None, backend: str | None = None) -> str:
    """The process-group backend for a model on ``device``: ``backend`` when given (checked),
    else NCCL for CUDA and gloo otherwise.

    Raises:
        ValueError: an unknown backend; NCCL with a non-CUDA device (NCCL moves CUDA tensors
            only).
    """
    cuda = device is not None and torch.device(device).type == "cuda"
    if backend is None:
        return "nccl" if cuda else "gloo"
    check_choice(backend, BACKENDS, "backend")
    if backend == "nccl" and not cuda:
        raise ValueError(f"backend='nccl' needs a CUDA device, got device={device!r}; use "
                         f"'gloo' on the CPU")
    return backend


class _Scorer(nn.Module):
    """``forward(child, parent, n_pos, validate) = model.score_pairs(...)``, so that DDP sees the call
    (DDP hooks its gradient all-reduce on a forward through the wrapper)."""

    def __init__(self, model: BoxHierarchyModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, child: torch.Tensor, parent: torch.Tensor, n_pos: int,
                validate: bool = True) -> PairScores:
        return self.model.score_pairs(child, parent, n_pos, validate=validate)


def _shard(pos: torch.Tensor, rank: int, world_size: int, seed: int) -> torch.Tensor:
    perm = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(seed))
    return pos[perm[rank::world_size]]


def _rank_generator(seed: int, rank: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + 7919 * (rank + 1))


def _loopback_interface() -> str | None:
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), or None."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (AttributeError, OSError):
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _resume_state(path: str, header: dict, world_size: int) -> dict[str, Any]:
    """The checkpoint at ``path``, checked against this run and its number of processes."""
    state = load_checkpoint(path, header)
    if len(state["generators"]) != world_size:
        raise ValueError(f"cannot resume from {path}: it was written by "
                         f"{len(state['generators'])} processes, not {world_size}")
    return state


def _train_rank(rank: int, world_size: int, local_rank: int, job: dict) -> tuple[
        BoxHierarchyModel, Trainer]:
    """Train shard ``rank`` inside an initialised process group; rank 0 writes checkpoints.
    Returns the model (identical on every rank) and the trainer (its history)."""
    cfg: HierarchyConfig = job["config"]
    path, header = job["checkpoint"], job["header"]
    # Read (and check) the checkpoint before DDP's first collective: a rank that raises with
    # collectives in flight can deadlock in the process group's destructor.
    state = _resume_state(path, header, world_size) if job["resume"] else None
    device = job["device"]
    if device is not None and torch.device(device).type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if job["init_state"] is not None:
        model = BoxHierarchyModel(job["num_nodes"], nodes=job["nodes"], device=device,
                                  **job["model_kwargs"])
        model.load_state_dict(job["init_state"])
    else:       # every rank builds the same boxes as train_hierarchy from the shared seed
        model = initial_model(job["num_nodes"], job["nodes"], cfg, job["pos"],
                              torch.Generator().manual_seed(job["seed"]), device)
    ddp = nn.parallel.DistributedDataParallel(
        _Scorer(model), device_ids=None if model.device.type == "cpu" else [model.device])
    pos = job["pos"]
    n_steps = max(1, math.ceil(pos.shape[0] / (world_size * cfg.batch_size)))

    def reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t / world_size

    trainer = Trainer(model, _shard(pos, rank, world_size, job["seed"]),
                      job["known"], cfg, _rank_generator(job["seed"], rank, model.device),
                      scorer=ddp, steps_per_epoch=n_steps, reduce=reduce)
    if state is not None:
        trainer.load_state_dict({**state["trainer"], "generator": state["generators"][rank]})
    while trainer.epoch < cfg.epochs:
        trainer.run_epoch()
        if path is not None and (trainer.epoch % cfg.checkpoint_every == 0
                                 or trainer.epoch == cfg.epochs):
            states: list[Any] = [None] * world_size
            dist.all_gather_object(states, trainer.generator.get_state())
            if rank == 0:
                atomic_save({**header, "trainer": trainer.state_dict(),
                             "generators": states, "world_size": world_size}, path)
            dist.barrier()
    return model, trainer


def _worker(rank: int, world_size: int, job: dict, out_path: str) -> None:
    """One spawned DDP process: join the group, train shard ``rank``; rank 0 writes the
    result to ``out_path``. A failure writes its traceback to ``out_path.rank<r>.err``.

    Either way the process leaves with ``os._exit`` and never tears its process group down:
    destroying a gloo group (directly, or by dropping the last DDP reducer that holds it)
    while its worker thread still releases a finished collective deadlocks (the destructor
    joins that thread holding the GIL, and the thread waits for the GIL; seen here on the
    failure path and, rarely, after a successful run). The final barrier makes every rank
    leave after the last collective of all ranks, and the operating system closes the
    sockets."""
    code = 0
    try:
        torch.set_num_threads(job["threads"])
        if job["backend"] == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
            # every spawned process is on this machine: gloo need not guess an interface from
            # the host name (which may resolve to one that is filtered)
            lo = _loopback_interface()
            if lo is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = lo
        dist.init_process_group(job["backend"], init_method=job["init_method"], rank=rank,
                                world_size=world_size, timeout=job["timeout"])
        model, trainer = _train_rank(rank, world_size, rank, job)
        if rank == 0:
            torch.save({"state_dict": model.cpu_state_dict(),
                        "history": trainer.history.__dict__}, out_path)
        dist.barrier()
    except BaseException:
        code = 1
        with open(f"{out_path}.rank{rank}.err", "w") as f:
            f.write(traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _worker_error(out_path: str) -> str | None:
    """The traceback of the first worker that failed (by the time its report was written)."""
    reports = sorted(glob.glob(glob.escape(out_path) + ".rank*.err"), key=os.path.getmtime)
    if not reports:
        return None
    with open(reports[0]) as f:
        return f.read()


def train_hierarchy_distributed(graph: nx.DiGraph, dim: int | HierarchyConfig | None = None,
                                method: Noise | str | None = None, *,
                                config: HierarchyConfig | None = None,
                                world_size: int | None = None,
                                backend: str | None = None, master_addr: str = "127.0.0.1",
                                master_port: int | None = None, train_edges: Any = None,
                                known_edges: torch.Tensor | None = None,
                                device: str | torch.device | None = None,
                                threads_per_process: int = 1,
                                model: BoxHierarchyModel | None = None,
                                checkpoint: str | os.PathLike | None = None,
                                resume: bool = False, timeout: float = 600.0,
                                **overrides: Any) -> TrainResult:
    """:func:`~perturb.boxes.hierarchy.train_hierarchy` on ``world_size`` DDP processes.

    ``config`` (and keyword overrides of its fields), ``train_edges``, ``known_edges``,
    ``model``, ``checkpoint`` and ``resume`` mean what they mean for ``train_hierarchy``;
    ``config.batch_size`` is per process (a step sees ``world_size · batch_size`` positives).
    The initial boxes are those that ``train_hierarchy(..., seed=config.seed)`` starts from
    (``config.seed=None``: a random seed shared by the processes).

    Two ways to run it:

    - **under torchrun** (the documented path for real jobs): every process that ``torchrun
      --nproc-per-node W script.py`` starts calls this function with the same arguments; it
      joins the ``env://`` process group torchrun set up (or the one already initialised),
      trains its shard and returns the result in every process. ``world_size`` is torchrun's
      (passing another raises).
    - **spawned from one process** (the examples, notebooks): ``world_size`` processes (default
      2) are started with ``torch.multiprocessing.spawn`` and meet through a file in a
      temporary folder (no TCP port is picked, so two jobs started together cannot race for
      one); ``master_port`` switches to a ``tcp://master_addr:master_port`` rendezvous.

    Args:
        world_size: number of processes (>= 1); default 2, or torchrun's ``WORLD_SIZE``.
        backend: ``"gloo"``, ``"nccl"`` or ``"mpi"``; default :func:`select_backend` (NCCL
            with a CUDA ``device``, process r on GPU ``LOCAL_RANK`` (spawned: ``r``) mod
            device_count; gloo on the CPU).
        master_addr, master_port: a TCP rendezvous for the spawned processes; default: the
            file rendezvous above.
        threads_per_process: ``torch.set_num_threads`` in each spawned worker.
        timeout: seconds a collective (and the rendezvous) may wait before it fails, instead of
            hanging when a process is lost.

    Returns:
        :class:`~perturb.boxes.hierarchy.TrainResult`: the model (on the CPU, rank 0's
        parameters, identical on every rank) and the history, whose step metrics are averaged
        over the ranks (``eval`` is empty: evaluate the returned model).

    Raises:
        ValueError: as ``train_hierarchy``; ``world_size < 1`` or, under torchrun, not its
            world size; an unknown backend, or NCCL without CUDA; a checkpoint written by
            another number of processes; ``optimizer="sparse_adam"`` (the lazy Adam's sparse
            gradients are not reduced by DDP).
        RuntimeError: a worker failed (its traceback is included).

    Example:
        >>> from perturb.boxes.hierarchy import balanced_tree
        >>> res = train_hierarchy_distributed(balanced_tree(2, 3), 2, world_size=2,
        ...                                   epochs=3, seed=0)                # doctest: +SKIP
    """
    launched = dist.is_torchelastic_launched()
    if world_size is not None:
        world_size = check_int(world_size, "world_size", low=1)
    if launched:
        env_world = int(os.environ["WORLD_SIZE"])
        if world_size is not None and world_size != env_world:
            raise ValueError(f"world_size={world_size} but torchrun started {env_world} "
                             f"processes: leave world_size out under torchrun")
        world_size = env_world
    elif world_size is None:
        world_size = 2
    check_positive(timeout, "timeout")
    cfg = resolve_config(config, dim, method, **overrides)
    if cfg.optimizer != "adam":
        # DDP reduces dense gradients; it would need to know the gathers' sparse ones up front
        raise ValueError(f"optimizer={cfg.optimizer!r} is not supported by the distributed "
                         f"trainer (DDP does not reduce the sparse row gradients of the lazy "
                         f"Adam); use optimizer='adam' or train_hierarchy")
    backend = select_backend(device, backend)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    pos = training_pairs(graph, train_edges, cfg.closure)
    n = graph.number_of_nodes()
    owns_group = launched and not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, init_method="env://",
                                timeout=datetime.timedelta(seconds=timeout))
    try:
        if cfg.seed is not None:
            seed = cfg.seed
        else:
            seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=resolve_generator()))
            if launched:                            # every process takes rank 0's
                box = [seed]
                dist.broadcast_object_list(box, src=0)
                seed = int(box[0])
        cfg = cfg.replace(seed=seed)                  # the processes (and a resume) share it
        model_kwargs = cfg.model_kwargs()
        init_state = None
        if model is not None:
            if model.num_nodes != n or model.dim != cfg.dim:
                raise ValueError(f"model has {model.num_nodes} boxes of dim {model.dim}, the "
                                 f"graph needs {n} of dim {cfg.dim}")
            hp = model.hparams()
            model_kwargs = {k: hp[k] for k in model_kwargs}
            init_state = model.cpu_state_dict()
        known = PairSet(pos if known_edges is None
                        else check_pairs(known_edges, n, "known_edges"), n, include_self=True)
        path = None if checkpoint is None else os.fspath(checkpoint)
        job = dict(config=cfg, model_kwargs=model_kwargs, init_state=init_state, seed=seed,
                   num_nodes=n, nodes=list(graph.nodes), device=device, backend=backend,
                   pos=pos, known=known, threads=threads_per_process, checkpoint=path,
                   header=None if path is None else checkpoint_header(cfg, pos, n),
                   resume=bool(resume and path is not None and os.path.exists(path)),
                   timeout=datetime.timedelta(seconds=timeout))
        if job["resume"] and path is not None:      # refuse before any process starts
            _resume_state(path, job["header"], world_size)
        if launched:
            rank = dist.get_rank()
            local_rank = int(os.environ.get("LOCAL_RANK", rank))
            trained, trainer = _train_rank(rank, world_size, local_rank, job)
            saved = {"state_dict": trained.cpu_state_dict(),
                     "history": dict(trainer.history.__dict__)}
            del trained, trainer      # DDP's reducer goes while the group is still registered
            dist.barrier()
    finally:
        if owns_group:
            dist.destroy_process_group()
    if not launched:
        with tempfile.TemporaryDirectory(prefix="perturb_ddp_") as tmp:
            job["init_method"] = (
                f"tcp://{master_addr}:{master_port}" if master_port is not None
                else "file://" + os.path.join(tmp, "rendezvous"))
            out_path = os.path.join(tmp, "rank0.pt")
            try:
                mp.spawn(_worker, args=(world_size, job, out_path), nprocs=world_size,
                         join=True)
            except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
                report = _worker_error(out_path)
                if report is None:
                    raise
                raise RuntimeError(f"a training process failed:\n{report}") from exc
            saved = torch.load(out_path, weights_only=True)
    result = BoxHierarchyModel(n, nodes=list(graph.nodes), **model_kwargs)
    result.load_state_dict(saved["state_dict"])
    result.eval()
    return TrainResult(result, TrainHistory(**saved["history"]))
