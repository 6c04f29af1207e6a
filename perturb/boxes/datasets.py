"""Hierarchies to embed as boxes (kept import path): the WordNet 3.0 noun hierarchy, graph tools,
synthetic DAGs and splits now live in :mod:`perturb.boxes.hierarchy` (modules ``wordnet``,
``graphs`` and ``splits``); this module re-exports them."""
from perturb.boxes.hierarchy.graphs import (balanced_tree, check_hierarchy, random_dag,
                                            random_tree, sub_hierarchy, transitive_closure,
                                            transitive_reduction)
from perturb.boxes.hierarchy.splits import (BenchmarkSplit, HierarchySplit, dasgupta_split,
                                            split_hierarchy)
from perturb.boxes.hierarchy.wordnet import (DEFAULT_WORDNET_DIR, WordNetSynset,
                                             read_wordnet_index, read_wordnet_nouns,
                                             wordnet_dir, wordnet_noun_hierarchy)

__all__ = [
    "DEFAULT_WORDNET_DIR",
    "WordNetSynset",
    "wordnet_dir",
    "read_wordnet_nouns",
    "read_wordnet_index",
    "wordnet_noun_hierarchy",
    "transitive_closure",
    "transitive_reduction",
    "sub_hierarchy",
    "check_hierarchy",
    "balanced_tree",
    "random_tree",
    "random_dag",
    "HierarchySplit",
    "split_hierarchy",
    "BenchmarkSplit",
    "dasgupta_split",
]
