r"""pFedMoE's local gating network and the switchable normalization it starts with.

Gating network (Yi et al., "pFedMoE: Data-Level Personalization with Mixture of Experts
for Model-Heterogeneous Personalized Federated Learning", arXiv 2402.01350, Sec. 4):
flatten image -> SwitchableNorm -> Linear(m) -> BatchNorm -> sigmoid -> Linear(2) ->
BatchNorm -> softmax, giving per sample the weights ``[alpha_global, alpha_local]`` of the
global and local experts' representations. The layer order follows the paper and the
pFedMoE re-implementation in thuiaaa/MHPFL (``pfedmoe_gate``).

Switchable normalization (Luo, Ren, Peng, Zhang, Li, "Differentiable Learning-to-Normalize
via Switchable Normalization", ICLR 2019):

.. math::
  \hat h = \gamma \frac{h - \sum_k w_k \mu_k}{\sqrt{\sum_k w'_k \sigma^2_k + \epsilon}}
    + \beta, \qquad w = \mathrm{softmax}(\lambda), \; w' = \mathrm{softmax}(\lambda')

over statistics k. For a 2-D input [B, D] (a flattened image), instance and layer
statistics coincide (both reduce over the D features of one sample; "instance" over one
channel of one sample would be a single value), so, like the official ``SwitchNorm1d``
(switchablenorms/Switchable-Normalization), k ranges over ``SN_STATISTICS = ('layer',
'batch')`` with two learned logit vectors ``mean_weight`` and ``var_weight`` (init 1, so
each starts at 1/2).

Choices, from the official SN code unless stated:
- running averages of the batch statistics with momentum 0.997 (``r <- 0.997 r + 0.003
  batch``), eps 1e-5; eval mode replaces batch statistics by them; layer statistics are
  always of the sample itself.
- Deviations: variances are biased (divide by B or D, as in the paper's equations; the
  PyTorch code uses the unbiased estimator, which is undefined for B = 1), and the
  running variance starts at 1 like BatchNorm's (the official code starts it at 0, which
  makes early eval-mode outputs too large).
- The gating BatchNorms use PyTorch's ``BatchNorm1d`` defaults (the reference code keeps
  them): momentum 0.1 (Flax ``momentum=0.9``), eps 1e-5, affine. The two Linear layers use
  PyTorch's default init, as in ``cnn.py``.

Padded examples can be left out of every batch statistic with ``mask``.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.cnn import dense

SN_STATISTICS = ("layer", "batch")


def layer_stats(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-sample mean and (biased) variance over features.

  Args:
    x: [B, D] float32.

  Returns:
    (mean [B, 1], var [B, 1]).
  """
  mean = jnp.mean(x, axis=-1, keepdims=True)
  return mean, jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)


def batch_stats(x: jax.Array, mask: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """Per-feature mean and (biased) variance over the (unmasked) batch.

  Args:
    x: [B, D] float32.
    mask: optional bool [B]; False rows are left out (all-False gives mean 0, var 0).

  Returns:
    (mean [D], var [D]).
  """
  w = jnp.ones(x.shape[:1], x.dtype) if mask is None else mask.astype(x.dtype)
  n = jnp.maximum(jnp.sum(w), 1.0)
  mean = jnp.sum(w[:, None] * x, axis=0) / n
  var = jnp.sum(w[:, None] * jnp.square(x - mean), axis=0) / n
  return mean, var


class SwitchableNorm(nn.Module):
  """Switchable normalization of a 2-D input [B, D] over {layer, batch} statistics.

  Params: ``mean_weight`` [2], ``var_weight`` [2] (logits over ``SN_STATISTICS``),
  ``scale`` [D] (gamma, init 1), ``bias`` [D] (beta, init 0). Collection
  ``batch_stats``: ``mean`` [D] (init 0), ``var`` [D] (init 1), updated only when
  ``use_running_average`` is False and the module is not initializing (call ``apply``
  with ``mutable=['batch_stats']``).

  Attributes:
    use_running_average: default for the call argument of the same name.
    momentum: running-average decay ``r <- momentum * r + (1 - momentum) * batch``.
    epsilon: added to the mixed variance.
    dtype: output dtype (statistics are always computed in float32).
  """
  use_running_average: bool | None = None
  momentum: float = 0.997
  epsilon: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, use_running_average: bool | None = None, *,
               mask: jax.Array | None = None) -> jax.Array:
    """Normalizes x.

    Args:
      x: [B, D].
      use_running_average: eval mode (running batch statistics); overrides the attribute.
      mask: optional bool [B]; False rows do not enter the batch statistics.

    Returns:
      [B, D] in ``dtype``.
    """
    use_ra = nn.merge_param("use_running_average", self.use_running_average,
                            use_running_average)
    if x.ndim != 2:
      raise ValueError(f"SwitchableNorm expects [B, D] input, got shape {x.shape}")
    d = x.shape[-1]
    x = x.astype(jnp.float32)
    ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (d,), jnp.float32)
    ra_var = self.variable("batch_stats", "var", jnp.ones, (d,), jnp.float32)
    mean_w = jax.nn.softmax(self.param("mean_weight", nn.initializers.ones, (2,)))
    var_w = jax.nn.softmax(self.param("var_weight", nn.initializers.ones, (2,)))
    mean_ln, var_ln = layer_stats(x)
    if use_ra:
      mean_bn, var_bn = ra_mean.value, ra_var.value
    else:
      mean_bn, var_bn = batch_stats(x, mask)
      if not self.is_initializing():
        m = self.momentum
        ra_mean.value = m * ra_mean.value + (1 - m) * mean_bn
        ra_var.value = m * ra_var.value + (1 - m) * var_bn
    mean = mean_w[0] * mean_ln + mean_w[1] * mean_bn
    var = var_w[0] * var_ln + var_w[1] * var_bn
    y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
    scale = self.param("scale", nn.initializers.ones, (d,))
    bias = self.param("bias", nn.initializers.zeros, (d,))
    return (y * scale + bias).astype(self.dtype)


class GatingNetwork(nn.Module):
  """pFedMoE's local gating network H_k(phi_k): images -> [alpha_global, alpha_local].

  Params: ``{'norm': SwitchableNorm [D=H*W*C], 'fc1': {'kernel': [D, m], 'bias': [m]},
  'bn1': {'scale', 'bias'} [m], 'fc2': {'kernel': [m, 2], 'bias': [2]}, 'bn2': {'scale',
  'bias'} [2]}``. Collection ``batch_stats``: ``{'norm': {'mean', 'var'} [D], 'bn1':
  {'mean', 'var'} [m], 'bn2': {'mean', 'var'} [2]}``.

  Attributes:
    hidden: width m of the hidden layer.
    bn_momentum: Flax BatchNorm momentum (0.9 = PyTorch's momentum 0.1).
    sn_momentum: SwitchableNorm running-average momentum (0.997, official SN).
    epsilon: epsilon of every normalization.
    dtype: computation dtype of the Linear layers (normalization statistics are float32).
  """
  hidden: int
  bn_momentum: float = 0.9
  sn_momentum: float = 0.997
  epsilon: float = 1e-5
  dtype: Any = jnp.float32

  def _bn(self, h: jax.Array, train: bool, mask: jax.Array | None, name: str):
    return nn.BatchNorm(use_running_average=not train, momentum=self.bn_momentum,
                        epsilon=self.epsilon, dtype=jnp.float32, name=name)(
                            h, mask=None if mask is None else mask[:, None])

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, *,
               mask: jax.Array | None = None) -> jax.Array:
    """Expert weights of each sample.

    Args:
      x: normalized images [B, H, W, C] (any trailing shape; flattened per sample).
      train: batch statistics (and running-average updates, with
        ``mutable=['batch_stats']``) if True, running averages if False.
      mask: optional bool [B]; False rows (padding) do not enter batch statistics.

    Returns:
      float32 [B, 2] = ``[alpha_global, alpha_local]``, each row summing to 1.
    """
    h = x.reshape(x.shape[0], -1)
    h = SwitchableNorm(momentum=self.sn_momentum, epsilon=self.epsilon,
                       dtype=self.dtype, name="norm")(h, not train, mask=mask)
    h = dense(h, self.hidden, name="fc1", dtype=self.dtype)
    h = nn.sigmoid(self._bn(h, train, mask, "bn1"))
    h = dense(h.astype(self.dtype), 2, name="fc2", dtype=self.dtype)
    h = self._bn(h, train, mask, "bn2")
    return jax.nn.softmax(h.astype(jnp.float32), axis=-1)
