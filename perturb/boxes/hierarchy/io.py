"""Files of the hierarchy application: trained models and training checkpoints.

Both are written atomically (a temporary file in the target's directory, flushed and fsynced,
then ``os.replace``), so a process killed while writing leaves the previous file intact, and
both hold plain Python values and tensors only, so they load with
``torch.load(weights_only=True)`` (no code runs while loading).

Checkpoints (``train_hierarchy(..., checkpoint=path)``) hold the trainer's state plus a header
(:func:`checkpoint_header`) that :func:`load_checkpoint` compares with the run that resumes.

A saved model holds the boxes (the ``BoxHierarchyModel`` state dict), the node labels (str,
int, float, bool or tuples of them) and the training :class:`HierarchyConfig` when given::

    save_model(result.model, "nouns.pt", config)
    model, config = load_model("nouns.pt")
    boxes = model.embedding.all_boxes()              # lower/upper corners, (num_nodes, dim)
    model.log_containment(model.ids(["dog.n.01"]), model.ids(["animal.n.01"]))
"""
from __future__ import annotations

import os
import tempfile
import zlib
from typing import Any, NamedTuple

import torch

from perturb.boxes.hierarchy.config import (RESUMABLE_CHANGES, HierarchyConfig,
                                            resolve_box_model)
from perturb.boxes.hierarchy.model import BoxHierarchyModel, check_model

__all__ = ["atomic_save", "save_model", "load_model", "SavedModel", "MODEL_FORMAT",
           "checkpoint_header", "load_checkpoint", "CHECKPOINT_FORMAT"]

#: ``format`` entry of a saved model file.
MODEL_FORMAT = "perturb.boxes.hierarchy.model/1"
#: ``format`` entry of a training checkpoint (written by the trainers).
CHECKPOINT_FORMAT = "perturb.boxes.hierarchy.checkpoint/1"
_LABEL_TYPES = (str, int, float, bool)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file at ``path``: writes a
    temporary file in the same directory, flushes and fsyncs it, then ``os.replace``s it
    (atomic on POSIX and Windows). The temporary file is removed on failure."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class SavedModel(NamedTuple):
    """What :func:`load_model` returns: the model and its training config (None if not
    saved)."""

    model: BoxHierarchyModel
    config: HierarchyConfig | None


def _check_label(u: Any) -> bool:
    if isinstance(u, tuple):
        return all(_check_label(v) for v in u)
    return isinstance(u, _LABEL_TYPES)


def save_model(model: BoxHierarchyModel, path: str | os.PathLike,
               config: HierarchyConfig | None = None) -> None:
    """Save a trained model (boxes, node labels, box model, and ``config``) to ``path``,
    atomically. Parameters are stored on the CPU.

    Raises:
        ValueError: ``model`` is not a BoxHierarchyModel; a node label that is not a str, int,
            float, bool or a tuple of them (other types would need unsafe unpickling).
    """
    check_model(model)
    bad = next((u for u in model.nodes if not _check_label(u)), None)
    if bad is not None:
        raise ValueError(f"node labels must be str, int, float, bool or tuples of them to be "
                         f"saved, got {type(bad).__name__} ({bad!r})")
    hp = model.hparams()
    hp["init"] = list(hp["init"])
    hp["dtype"] = str(hp["dtype"]).removeprefix("torch.")
    atomic_save({"format": MODEL_FORMAT, "hparams": hp, "nodes": list(model.nodes),
                 "state_dict": model.cpu_state_dict(),
                 "config": None if config is None else config.to_dict()}, path)


def load_model(path: str | os.PathLike, *, device: torch.device | str | None = None
               ) -> SavedModel:
    """Load a model saved by :func:`save_model` (``torch.load(weights_only=True)``), onto
    ``device`` (default CPU), in eval mode.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a saved hierarchy model.
    """
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
        raise ValueError(f"{os.fspath(path)} is not a hierarchy model saved by save_model "
                         f"(format {MODEL_FORMAT!r})")
    hp = dict(data["hparams"])
    if "method" in hp:     # written before noise objects: the same model, without a warning
        hp["noise"], hp["temperature"] = resolve_box_model(
            "load_model", None, hp.get("temperature"), hp.pop("method"), hp.pop("beta", None),
            warn=False)
    hp["dtype"] = getattr(torch, hp["dtype"])
    hp["init"] = tuple(hp["init"])
    model = BoxHierarchyModel(**hp, nodes=data["nodes"], device=device)
    model.load_state_dict(data["state_dict"])
    model.eval()
    config = None if data["config"] is None else HierarchyConfig.from_dict(data["config"])
    return SavedModel(model, config)


def checkpoint_header(config: HierarchyConfig, positives: torch.Tensor, num_nodes: int
                      ) -> dict[str, Any]:
    """What a checkpoint records about its run, to refuse resuming a different one."""
    return {"format": CHECKPOINT_FORMAT, "config": config.to_dict(), "num_nodes": num_nodes,
            "positives": int(positives.shape[0]), "positives_crc": _crc(positives)}


def load_checkpoint(path: str | os.PathLike, header: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """Read a checkpoint (``torch.load(weights_only=True)``, tensors on the CPU) and, given the
    ``header`` of the run that wants to resume, check that it is the same run.

    Raises:
        ValueError: not a checkpoint; a different config (besides ``epochs``,
            ``checkpoint_every``, ``eval_every``), number of nodes or training pairs.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{os.fspath(path)} is not a hierarchy training checkpoint")
    if header is not None:
        diff = HierarchyConfig.from_dict(state["config"]).differences(
            HierarchyConfig.from_dict(header["config"]), ignore=RESUMABLE_CHANGES)
        if diff:
            raise ValueError(f"cannot resume from {os.fspath(path)}: the config differs in "
                             + ", ".join(f"{k} (checkpoint {a!r}, now {b!r})"
                                         for k, (a, b) in diff.items()))
        for key in ("num_nodes", "positives", "positives_crc"):
            if state[key] != header[key]:
                raise ValueError(f"cannot resume from {os.fspath(path)}: it was trained on "
                                 f"other data ({key}: {state[key]} vs {header[key]})")
    return state


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(t.detach().cpu().contiguous().numpy().tobytes())
