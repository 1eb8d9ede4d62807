r"""A model family of your own for the heterogeneous algorithms (docs/extending.md).

An architecture is a factory ``factory(*, rep_dim, dtype) -> flax.linen.Module`` whose
module maps normalized images [B, H, W, C] to ``(rep [B, rep_dim], features)``;
fedjax-het puts the linear header on top, so FedMRL, FedMoE and every other algorithm
run on it. ``assign`` gives client k its architecture.

  python experiments/main.py --config=experiments/fedmrl.py:smoke \
      --config.models=examples.my_models:assign --workdir=/tmp/fedmrl_mine
  python experiments/main.py --config=experiments/fedmoe.py:smoke \
      --config.models=examples.my_models:mlp,examples.my_models:convnet \
      --config.algo.global_arch=examples.my_models:mlp --workdir=/tmp/fedmoe_mine
"""
from typing import Any

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
  """Flatten, ReLU layers of widths ``hidden``, then the representation layer."""
  hidden: tuple[int, ...]
  rep_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1).astype(self.dtype)
    feats = {}
    for i, width in enumerate(self.hidden, start=1):
      x = feats[f"fc{i}"] = nn.relu(nn.Dense(width, dtype=self.dtype, name=f"fc{i}")(x))
    return nn.relu(nn.Dense(self.rep_dim, dtype=self.dtype, name="rep")(x)), feats


class ConvNet(nn.Module):
  """3x3 SAME convolutions with 2x2 pooling, global average pooling, representation."""
  features: tuple[int, ...]
  rep_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = x.astype(self.dtype)
    feats = {}
    for i, width in enumerate(self.features, start=1):
      x = feats[f"conv{i}"] = nn.relu(nn.Conv(width, (3, 3), dtype=self.dtype,
                                              name=f"conv{i}")(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = jnp.mean(x, axis=(1, 2))  # any image size
    return nn.relu(nn.Dense(self.rep_dim, dtype=self.dtype, name="rep")(x)), feats


def mlp(*, rep_dim: int, dtype=jnp.float32) -> nn.Module:
  return MLP((64,), rep_dim, dtype)


def wide_mlp(*, rep_dim: int, dtype=jnp.float32) -> nn.Module:
  return MLP((128,), rep_dim, dtype)


def convnet(*, rep_dim: int, dtype=jnp.float32) -> nn.Module:
  return ConvNet((8, 16), rep_dim, dtype)


def assign(client_id: int) -> str:
  """Client k's architecture: the ConvNet, the MLP and the wide MLP in turn."""
  return ("examples.my_models:convnet", "examples.my_models:mlp",
          "examples.my_models:wide_mlp")[client_id % 3]
