"""Client architectures of the user's own: an extractor of theirs, our linear header.

A custom architecture (docs/extending.md) is a *factory* ``factory(*, rep_dim, dtype) ->
flax.linen.Module`` whose module maps normalized images ``[B, H, W, C]`` to
``(rep [B, rep_dim], {name: feature})``, as ``CNNExtractor`` does (the dict may be
empty; ``registry.check_architectures`` checks the shapes before a run).
``Classifier`` puts the prediction header of the CNNs on top
(``Header``, one linear layer), so the model has the CNNs' interface and params tree
``{'extractor': ..., 'header': ...}`` and every algorithm runs on it: FedMRL fuses and
classifies representations (``extract`` / ``classify``), LG-FedAvg averages headers,
FedMoE uses an extractor alone as its global expert, FedProto and FD read ``'rep'``.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.cnn import Header


class Classifier(nn.Module):
  """A user's extractor + the linear header, with the interface of ``cnn.CNN``.

  Params: ``{'extractor': <the extractor's>, 'header': {'fc': {...}}}``.

  Attributes:
    extractor: the module a factory returned: images -> ``(rep [B, rep_dim],
      features)``.
    num_classes: number of classes C.
    rep_dim: width of the representation (what the factory was asked for).
    dtype: computation dtype of the header; parameters are float32.
  """
  extractor: nn.Module
  num_classes: int
  rep_dim: int = 500
  dtype: Any = jnp.float32

  def setup(self):
    self.header = Header(self.num_classes, self.dtype)

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(logits [B, C], features)``; features hold the extractor's, ``'rep'``, ``'logits'``."""
    rep, feats = self.extractor(x)
    logits = self.header(rep)
    return logits, dict(feats, rep=rep, logits=logits)

  def extract(self, x: jax.Array) -> jax.Array:
    """Representation [B, rep_dim] of normalized images [B, H, W, C]."""
    return self.extractor(x)[0]

  def classify(self, rep: jax.Array) -> jax.Array:
    """Header logits [B, C] of a representation [B, rep_dim]."""
    return self.header(rep)
