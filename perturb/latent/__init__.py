"""Building blocks for latent-variable experiments (examples/ runs them end to end)."""
from perturb.latent.categorical_vae import CategoricalVAE
from perturb.latent.data import (
    NonlinearICAData,
    binarized_digits,
    make_nonlinear_ica,
    perturbed_binary,
)
from perturb.latent.ivae import IVAE
from perturb.latent.listops import (
    LISTOPS_VOCAB,
    LatentListOpsModel,
    ListOpsBatch,
    edge_precision_recall,
    gold_arborescence,
    make_listops,
)
from perturb.latent.metrics import correlation_matrix, mean_corr_coef
from perturb.latent.selector import SubsetSelector

__all__ = [
    "CategoricalVAE", "IVAE", "SubsetSelector", "NonlinearICAData", "make_nonlinear_ica",
    "perturbed_binary", "binarized_digits", "correlation_matrix", "mean_corr_coef",
    "LatentListOpsModel", "ListOpsBatch", "make_listops", "gold_arborescence",
    "edge_precision_recall", "LISTOPS_VOCAB",
]
