"""Box embeddings: hard, soft and Gumbel boxes, boxes perturbed by any noise, their volumes,
intersections and training losses.

See ``docs/boxes.md`` for the math (Gumbel corner orientation, max-stability, the Bessel volume).
The hierarchy application (WordNet, training, evaluation) is the subpackage
:mod:`perturb.boxes.hierarchy`; its main entry points are re-exported here.
"""
from perturb.boxes.box import Box, join
from perturb.boxes.embedding import BoxEmbedding
from perturb.boxes.expected_volumes import expected_volume, volume
from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    all_pairs_f1,
    evaluate,
    train_hierarchy,
)
from perturb.boxes.intersections import (containment_prob, intersection, log1m_containment_prob,
                                        log1mexp, log_containment_prob, overlap)
from perturb.boxes.losses import (containment_loss, overlap_loss, sample_negatives,
                                  volume_regularizer)
from perturb.boxes.volumes import EULER_GAMMA, gumbel_side_length, log_gumbel_side_length

__all__ = [
    "Box",
    "join",
    "volume",
    "expected_volume",
    "gumbel_side_length",
    "log_gumbel_side_length",
    "EULER_GAMMA",
    "intersection",
    "containment_prob",
    "log_containment_prob",
    "log1m_containment_prob",
    "overlap",
    "BoxEmbedding",
    "containment_loss",
    "overlap_loss",
    "volume_regularizer",
    "sample_negatives",
    "log1mexp",
    "BoxHierarchyModel",
    "train_hierarchy",
    "evaluate",
    "all_pairs_f1",
]
