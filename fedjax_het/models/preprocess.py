"""Input preprocessing shared by every model: per-channel standardization.

The models take float images already normalized; the data pipeline keeps uint8 and calls
``normalize`` on each minibatch (inside the compiled step), so the pooled data stays
4x smaller on device. The statistics are the dataset's (``Runtime.normalization``, from
``data.sources.normalization``): CIFAR's below for CIFAR-10 and CIFAR-100, computed from
the training split (or given in the config) for any other dataset.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def normalize(x: jax.Array,
              stats: tuple[Sequence[float], Sequence[float]] | None = None) -> jax.Array:
  r"""Scales uint8 images to [0, 1] and standardizes each channel.

  .. math:: \hat x_c = (x_c / 255 - \mu_c) / \sigma_c

  Args:
    x: uint8 (or any numeric) images ``[..., H, W, C]`` with values in [0, 255],
      channels last.
    stats: ``(mean [C], std [C])`` of the dataset's pixels scaled to [0, 1]; None: the
      CIFAR-10 training-set channel means ``CIFAR_MEAN`` and stds ``CIFAR_STD``.

  Returns:
    float32 array of the same shape.

  >>> import numpy as np
  >>> np.asarray(normalize(np.full((1, 1, 3), 255, np.uint8)), float).round(2).tolist()
  [[[2.06, 2.13, 2.12]]]
  >>> np.asarray(normalize(np.full((1, 1, 1), 51, np.uint8), ((0.1,), (0.5,))), float
  ...            ).round(2).tolist()
  [[[0.2]]]
  """
  mean, std = stats if stats is not None else (CIFAR_MEAN, CIFAR_STD)
  x = jnp.asarray(x).astype(jnp.float32) / 255.0
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)
  return (x - mean) / std
