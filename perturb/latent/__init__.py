"""Building blocks for latent-variable experiments (examples/ runs them end to end)."""
from perturb.latent.categorical_vae import CategoricalVAE
from perturb.latent.data import (
    NonlinearICAData,
    binarized_digits,
    make_nonlinear_ica,
    perturbed_binary,
)
from perturb.latent.graph_layout import (
    GraphELBO,
    GraphLayoutData,
    GraphLayoutVAE,
    edge_precision_recall,
    force_directed_layout,
    gumbel_kl,
    make_graph_layout,
    random_trees,
)
from perturb.latent.ivae import IVAE
from perturb.latent.listops import (
    LISTOPS_VOCAB,
    LatentListOpsModel,
    ListOpsBatch,
    arc_precision_recall,
    gold_arborescence,
    make_listops,
)
from perturb.latent.metrics import correlation_matrix, mean_corr_coef
from perturb.latent.selector import SubsetSelector

__all__ = [
    "CategoricalVAE", "IVAE", "SubsetSelector", "NonlinearICAData", "make_nonlinear_ica",
    "perturbed_binary", "binarized_digits", "correlation_matrix", "mean_corr_coef",
    "GraphLayoutVAE", "GraphELBO", "GraphLayoutData", "make_graph_layout", "random_trees",
    "force_directed_layout", "gumbel_kl", "edge_precision_recall",
    "LatentListOpsModel", "ListOpsBatch", "make_listops", "gold_arborescence",
    "arc_precision_recall", "LISTOPS_VOCAB",
]
