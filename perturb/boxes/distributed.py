"""Data-parallel hierarchy training (kept import path): now
:mod:`perturb.boxes.hierarchy.distributed`, re-exported here."""
from perturb.boxes.hierarchy.distributed import (free_port, select_backend,
                                                 train_hierarchy_distributed)

__all__ = ["train_hierarchy_distributed", "free_port", "select_backend"]
