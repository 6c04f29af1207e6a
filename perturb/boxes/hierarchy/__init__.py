"""The box-hierarchy application: embed a hierarchy (a DAG such as the WordNet noun hierarchy)
as boxes, one per node, so that a child's box lies inside its parent's box.

Modules: :mod:`~perturb.boxes.hierarchy.wordnet` and :mod:`~perturb.boxes.hierarchy.graphs`
(data: WordNet 3.0, closures, synthetic DAGs), :mod:`~perturb.boxes.hierarchy.splits` (the
generalisation splits and the published protocol), :mod:`~perturb.boxes.hierarchy.config`
(one :class:`HierarchyConfig` for every trainer), :mod:`~perturb.boxes.hierarchy.init`
(boxes nested along the training edges), :mod:`~perturb.boxes.hierarchy.model`,
:mod:`~perturb.boxes.hierarchy.evaluation`, :mod:`~perturb.boxes.hierarchy.training`,
:mod:`~perturb.boxes.hierarchy.distributed` and :mod:`~perturb.boxes.hierarchy.io` (saved
models, atomic writes). See ``docs/box_hierarchy.md``.
"""
from perturb.boxes.hierarchy.config import HierarchyConfig
from perturb.boxes.hierarchy.distributed import (free_port, select_backend,
                                                 train_hierarchy_distributed)
from perturb.boxes.hierarchy.evaluation import (EvalResult, SplitEval, all_pairs_f1,
                                                best_f1_threshold, evaluate, evaluate_split,
                                                score_all_pairs, score_pairs)
from perturb.boxes.hierarchy.graphs import (balanced_tree, check_hierarchy, check_pairs,
                                            edge_index, random_dag, random_tree, sub_hierarchy,
                                            transitive_closure, transitive_reduction)
from perturb.boxes.hierarchy.init import hierarchy_levels, nested_boxes
from perturb.boxes.hierarchy.io import SavedModel, load_checkpoint, load_model, save_model
from perturb.boxes.hierarchy.model import BoxHierarchyModel, PairScores, check_model
from perturb.boxes.hierarchy.rng import resolve_generator
from perturb.boxes.hierarchy.splits import (BenchmarkSplit, HierarchySplit, dasgupta_split,
                                            split_hierarchy)
from perturb.boxes.hierarchy.training import (VOLUME_QUANTILES, Trainer, TrainHistory,
                                              TrainResult, initial_model, train_hierarchy)
from perturb.boxes.hierarchy.wordnet import (DEFAULT_WORDNET_DIR, WordNetSynset,
                                             read_wordnet_index, read_wordnet_nouns,
                                             wordnet_dir, wordnet_noun_hierarchy)

__all__ = [
    # configuration, model, training
    "HierarchyConfig",
    "BoxHierarchyModel",
    "PairScores",
    "nested_boxes",
    "hierarchy_levels",
    "initial_model",
    "train_hierarchy",
    "train_hierarchy_distributed",
    "Trainer",
    "TrainHistory",
    "TrainResult",
    "VOLUME_QUANTILES",
    "load_checkpoint",
    "select_backend",
    "free_port",
    "save_model",
    "load_model",
    "SavedModel",
    # evaluation
    "EvalResult",
    "SplitEval",
    "evaluate",
    "evaluate_split",
    "best_f1_threshold",
    "score_pairs",
    "score_all_pairs",
    "all_pairs_f1",
    # data
    "edge_index",
    "check_pairs",
    "check_model",
    "check_hierarchy",
    "transitive_closure",
    "transitive_reduction",
    "sub_hierarchy",
    "balanced_tree",
    "random_tree",
    "random_dag",
    "resolve_generator",
    "HierarchySplit",
    "split_hierarchy",
    "BenchmarkSplit",
    "dasgupta_split",
    "DEFAULT_WORDNET_DIR",
    "WordNetSynset",
    "wordnet_dir",
    "read_wordnet_nouns",
    "read_wordnet_index",
    "wordnet_noun_hierarchy",
]
