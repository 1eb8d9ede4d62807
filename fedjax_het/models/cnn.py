"""The heterogeneous CNNs of the pFedMoE / FedMRL papers (Flax linen).

Yi et al., "FedMRL: Federated Model Heterogeneous Matryoshka Representation Learning"
(NeurIPS 2024, Table 6) and "pFedMoE: Data-Level Personalization with Mixture of Experts
for Model-Heterogeneous Personalized Federated Learning" (arXiv 2402.01350, Table 5).

=====  =====  =====  ======  =====  ========
model  conv1  conv2  fc1     fc2    fc3
=====  =====  =====  ======  =====  ========
CNN-1  16     32     2000    500    classes
CNN-2  16     16     2000    500    classes
CNN-3  16     32     1000    500    classes
CNN-4  16     32     800     500    classes
CNN-5  16     32     500     500    classes
=====  =====  =====  ======  =====  ========

Convolutions are 5x5, VALID, stride 1, each followed by ReLU and a 2x2/2 max-pool
(32x32x3 -> 28x28xc1 -> 14x14xc1 -> 10x10xc2 -> 5x5xc2). conv1..fc2 form the feature
extractor; fc2 (``rep_dim`` units, 500 by default, FedMRL's small model uses 100..500)
outputs the representation; fc3 is the prediction header.

Choices taken from the reference code (LipingYi/FedMRL ``Models/CNNs.py``, and the
pFedMoE re-implementation in thuiaaa/MHPFL ``pFMcnn.py``):

- The representation is taken **after** the ReLU of fc2 (the reference returns
  ``relu(fc2(x))`` as the representation fed to the header / mixed by the gate).
- Parameters use PyTorch's default initialisation, which the reference leaves in place:
  kernels ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (``variance_scaling(1/3, fan_in,
  uniform)``) and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.
- Flatten order differs: we flatten NHWC, PyTorch flattens NCHW. That is a fixed
  permutation of fc1's input rows, so the function class and parameter counts are equal.

Models return ``(logits, features)``; ``features`` names intermediate activations
(``conv1``, ``conv2``: post-ReLU, *before* pooling; ``fc1``; ``rep``; ``logits``), so
algorithms pick representations by name instead of hooking into a module.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

PyTree = Any
KERNEL_SIZE = (5, 5)
POOL = (2, 2)

# PyTorch's nn.Linear / nn.Conv2d default kernel init (kaiming_uniform with a=sqrt(5)).
torch_kernel_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_bias_init(fan_in: int) -> Callable:
  """PyTorch's default bias init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

  Args:
    fan_in: number of inputs of one output unit (``in_features`` or ``k*k*in_channels``).

  Returns:
    A Flax initializer ``(key, shape, dtype) -> array``.
  """
  bound = 1.0 / (fan_in ** 0.5)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def dense(x: jax.Array, features: int, *, name: str, dtype: Any) -> jax.Array:
  """A torch-initialised ``nn.Dense`` (float32 params, ``dtype`` compute) applied to x.

  Must be called inside a compact method.

  Args:
    x: [B, D_in].
    features: D_out.
    name: submodule name (the params key).
    dtype: computation dtype.

  Returns:
    [B, D_out] in ``dtype``.
  """
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32,
                  kernel_init=torch_kernel_init,
                  bias_init=torch_bias_init(x.shape[-1]), name=name)(x)


def cpu_kernels() -> bool:
  """Whether the default backend is XLA:CPU, where the models use the forms below."""
  return jax.default_backend() == "cpu"


# ---- CPU kernels: convolutions as im2col matmuls in a channels-first layout
#
# On CPU the extractor runs its convolutions on activations laid out [C, B, H, W]
# ("channels first, then batch"). The im2col matrix is then [kh*kw*C, B*H'*W']: its
# rows are whole shifted [B, H', W'] windows (copies of contiguous image rows), where
# the NHWC matrix [B*H'*W', kh*kw*C] interleaves 3-float pieces of the first layer's
# input; and each matmul has the long B*H'*W' axis as its output width. im2col stacks
# the kw column shifts, then the kh row shifts of those (two fused copies; one stack of
# all 25 windows made XLA:CPU materialise every window first). Its transpose, col2im, is
# a loop over the kh*kw offsets: unrolled, XLA:CPU fused the 25-term sum into the
# pooling gradient that consumes it and recomputed it for each of the four positions of
# a window. Pooling has an elementwise gradient instead of XLA:CPU's scatter. With these
# kernels and the in-dispatch evaluation, a FedMRL round of the :cpu config takes 2.6 s
# where 7.2 s were measured before (docs/performance.md).


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def patches_cf(x: jax.Array, kh: int, kw: int) -> jax.Array:
  """im2col of channels-first ``x`` [C, B, H, W] for a VALID kh x kw convolution.

  Returns:
    [kh*kw*C, B, H-kh+1, W-kw+1]; row ``(i*kw + j)*C + c`` is channel c shifted by
    (i, j), the row order of an HWIO kernel reshaped to [kh*kw*C, C_out]. The gradient
    is the col2im sum of the shifted windows.
  """
  h, w = x.shape[2] - kh + 1, x.shape[3] - kw + 1
  cols = jnp.stack([x[:, :, :, j:j + w] for j in range(kw)])  # [kw, C, B, H, W']
  rows = jnp.stack([cols[:, :, :, i:i + h] for i in range(kh)])  # [kh, kw, C, B, H', W']
  return rows.reshape((-1,) + rows.shape[3:])


def _patches_cf_fwd(x, kh, kw):
  return patches_cf(x, kh, kw), x.shape


def _patches_cf_bwd(kh, kw, shape, g):
  """col2im: each shifted window's gradient added back at its offset, in offset order."""
  c = shape[0]
  g = g.reshape((kh * kw, c) + g.shape[1:])

  def add_window(k, dx):
    i, j = k // kw, k % kw
    start = (0, 0, i, j)
    window = jax.lax.dynamic_slice(dx, start, g.shape[1:])
    return jax.lax.dynamic_update_slice(dx, window + g[k], start)

  return (jax.lax.fori_loop(0, kh * kw, add_window, jnp.zeros(shape, g.dtype)),)


patches_cf.defvjp(_patches_cf_fwd, _patches_cf_bwd)


def conv_cf(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """VALID convolution of channels-first ``x`` [C, B, H, W] with an HWIO ``kernel``.

  One matmul ``kernel^T [C_out, kh*kw*C] @ patches [kh*kw*C, B*H'*W']``.

  Returns:
    [C_out, B, H-kh+1, W-kw+1] in ``x``'s dtype.
  """
  kh, kw, c, f = kernel.shape
  cols = patches_cf(x, kh, kw)
  out = jax.lax.dot_general(kernel.reshape(kh * kw * c, f), cols.reshape(kh * kw * c, -1),
                            (((0,), (0,)), ((), ())))
  return out.reshape((f,) + cols.shape[1:]) + bias[:, None, None, None]


def _pool_windows(x: jax.Array, axis: int) -> jax.Array:
  """Splits axes ``axis`` (H) and ``axis + 1`` (W) into 2x2 windows (odd edges dropped):
  [..., H, W, ...] -> [..., H // 2, 2, W // 2, 2, ...]."""
  h2, w2 = x.shape[axis] // 2, x.shape[axis + 1] // 2
  x = jax.lax.slice_in_dim(jax.lax.slice_in_dim(x, 0, 2 * h2, axis=axis), 0, 2 * w2,
                           axis=axis + 1)
  return x.reshape(x.shape[:axis] + (h2, 2, w2, 2) + x.shape[axis + 2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def pool_2x2(x: jax.Array, axis: int) -> jax.Array:
  """2x2 / stride 2 max-pool over axes (``axis``, ``axis + 1``) with an elementwise
  gradient: each window's gradient goes to its first maximum in row-major order, as
  XLA's select-and-scatter (``ge``) gradient of ``nn.max_pool`` and PyTorch's give it."""
  return jnp.max(_pool_windows(x, axis), axis=(axis + 1, axis + 3))


def _pool_2x2_fwd(x, axis):
  """The pooled values and each window's first-maximum position 0..3 (int8: a quarter
  of ``x``'s elements, all the backward pass needs)."""
  windows = _pool_windows(x, axis)
  y = jnp.max(windows, axis=(axis + 1, axis + 3))
  first = jnp.full(y.shape, 3, jnp.int8)
  for pos in (2, 1, 0):
    window = jax.lax.index_in_dim(jax.lax.index_in_dim(windows, pos // 2, axis + 1, False),
                                  pos % 2, axis + 2, False)
    first = jnp.where(window == y, jnp.int8(pos), first)
  return y, (first, x.shape)


def _pool_2x2_bwd(axis, res, g):
  first, shape = res
  h2, w2 = first.shape[axis], first.shape[axis + 1]
  spread = lambda a: jnp.expand_dims(a, (axis + 1, axis + 3))  # [.., h2, 1, w2, 1, ..]
  pos_shape = [1] * (first.ndim + 2)
  pos_shape[axis + 1] = pos_shape[axis + 3] = 2
  pos = (2 * jax.lax.broadcasted_iota(jnp.int8, pos_shape, axis + 1)
         + jax.lax.broadcasted_iota(jnp.int8, pos_shape, axis + 3))
  dx = jnp.where(pos == spread(first), spread(g), jnp.zeros((), g.dtype))
  dx = dx.reshape(first.shape[:axis] + (2 * h2, 2 * w2) + first.shape[axis + 2:])
  pad = [(0, 0)] * dx.ndim
  pad[axis], pad[axis + 1] = (0, shape[axis] - 2 * h2), (0, shape[axis + 1] - 2 * w2)
  return (jnp.pad(dx, pad),)


pool_2x2.defvjp(_pool_2x2_fwd, _pool_2x2_bwd)


class Im2ColConv(nn.Module):
  """A 5x5 VALID convolution as im2col: 25 shifted windows, one matmul.

  Same parameters (``kernel`` HWIO, ``bias``), initialisation and output as ``nn.Conv``.
  XLA:CPU runs ``nn.Conv``'s gradient convolutions inside ``lax.scan`` (every local
  training loop) on a slow path, about 9x slower than this form (docs/performance.md);
  accelerators use ``nn.Conv``.

  Attributes:
    features: C_out.
    dtype: computation dtype.
    channels_first: ``x`` and the output are [C, B, H, W] (``conv_cf``, what
      ``CNNExtractor`` runs on CPU) instead of NHWC.
  """
  features: int
  dtype: Any = jnp.float32
  channels_first: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kh, kw = KERNEL_SIZE
    c = x.shape[0 if self.channels_first else -1]
    kernel = self.param("kernel", torch_kernel_init, (kh, kw, c, self.features),
                        jnp.float32)
    bias = self.param("bias", torch_bias_init(kh * kw * c), (self.features,), jnp.float32)
    x, kernel, bias = (a.astype(self.dtype) for a in (x, kernel, bias))
    if self.channels_first:
      return conv_cf(x, kernel, bias)
    h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    cols = jnp.concatenate([x[:, i:i + h, j:j + w, :] for i in range(kh) for j in range(kw)],
                           axis=-1)
    return cols @ kernel.reshape(kh * kw * c, self.features) + bias


def max_pool(x: jax.Array, *, reshape: bool | None = None) -> jax.Array:
  """2x2 / stride 2 max-pool of NHWC ``x`` (VALID: an odd last row or column is dropped).

  Args:
    x: [B, H, W, C].
    reshape: pool as a max over a ``[B, H/2, 2, W/2, 2, C]`` view whose gradient is one
      elementwise fusion (to each window's first maximum, as ``nn.max_pool``'s); None:
      on CPU only.
      XLA:CPU expands ``nn.max_pool``'s gradient (select-and-scatter) into a reduce-window
      over value and index tuples and a scatter, which took about a fifth of a FedMRL
      training step (docs/performance.md).

  Returns:
    [B, H // 2, W // 2, C], the same values as ``nn.max_pool(x, (2, 2), (2, 2))``.
  """
  if reshape is None:
    reshape = cpu_kernels()
  if reshape:
    return pool_2x2(x, 1)
  return nn.max_pool(x, POOL, strides=POOL)


def conv(x: jax.Array, features: int, *, name: str, dtype: Any,
         im2col: bool | None = None) -> jax.Array:
  """A torch-initialised 5x5 VALID convolution applied to NHWC ``x``.

  Args:
    x: [B, H, W, C_in].
    features: C_out.
    name: submodule name.
    dtype: computation dtype.
    im2col: use ``Im2ColConv`` (same parameters); None: on CPU only.

  Returns:
    [B, H-4, W-4, C_out] in ``dtype``.
  """
  if im2col is None:
    im2col = cpu_kernels()
  if im2col:
    return Im2ColConv(features, dtype, name=name)(x)
  fan_in = KERNEL_SIZE[0] * KERNEL_SIZE[1] * x.shape[-1]
  return nn.Conv(features, KERNEL_SIZE, padding="VALID", dtype=dtype,
                 param_dtype=jnp.float32, kernel_init=torch_kernel_init,
                 bias_init=torch_bias_init(fan_in), name=name)(x)


class CNNExtractor(nn.Module):
  """Feature extractor: (conv-ReLU-pool) per conv layer, (FC-ReLU) per FC layer.

  Params: ``{'conv1', ..., 'conv{n}', 'fc1', ..., 'fc{m+1}'}``, each ``{'kernel',
  'bias'}``; ``fc{m+1}`` is the representation layer with ``rep_dim`` units.

  Attributes:
    conv_features: output channels of each 5x5 convolution, e.g. ``(16, 32)``.
    fc_features: widths of the hidden FC layers *before* the representation layer,
      e.g. ``(2000,)`` for CNN-1.
    rep_dim: width of the representation (the last extractor FC layer).
    dtype: computation dtype; parameters are always float32.
    channels_first: run the convolutions and pools on [C, B, H, W] activations
      (``conv_cf``, ``pool_2x2``: what XLA:CPU runs fastest); None: on CPU only.
      Parameters and outputs are the same either way (up to float rounding).
  """
  conv_features: tuple[int, ...]
  fc_features: tuple[int, ...]
  rep_dim: int = 500
  dtype: Any = jnp.float32
  channels_first: bool | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Representation of normalized images.

    Args:
      x: float images [B, 32, 32, 3], already normalized (see ``preprocess.normalize``).

    Returns:
      ``(rep, features)``: rep [B, rep_dim] (post-ReLU) in ``dtype``; features maps
      ``'conv{i}'`` -> [B, H_i, W_i, C_i] (post-ReLU, before pooling), ``'fc{i}'`` ->
      [B, fc_features[i-1]] and ``'rep'`` -> rep.
    """
    feats = {}
    x = x.astype(self.dtype)
    cf = cpu_kernels() if self.channels_first is None else self.channels_first
    if cf:
      x = jnp.transpose(x, (3, 0, 1, 2))  # [C, B, H, W]
    for i, c in enumerate(self.conv_features, start=1):
      if cf:
        x = nn.relu(Im2ColConv(c, self.dtype, channels_first=True, name=f"conv{i}")(x))
        feats[f"conv{i}"] = jnp.transpose(x, (1, 2, 3, 0))
        x = pool_2x2(x, 2)
      else:
        x = nn.relu(conv(x, c, name=f"conv{i}", dtype=self.dtype))
        feats[f"conv{i}"] = x
        x = max_pool(x)
    if cf:
      x = jnp.transpose(x, (1, 2, 3, 0))  # NHWC, so fc1's rows keep their order
    x = x.reshape(x.shape[0], -1)
    for i, f in enumerate(self.fc_features, start=1):
      x = nn.relu(dense(x, f, name=f"fc{i}", dtype=self.dtype))
      feats[f"fc{i}"] = x
    rep = nn.relu(dense(x, self.rep_dim, name=f"fc{len(self.fc_features) + 1}",
                        dtype=self.dtype))
    feats["rep"] = rep
    return rep, feats


class Header(nn.Module):
  """Prediction header: one linear layer, representation -> logits.

  Params: ``{'fc': {'kernel': [rep_dim, num_classes], 'bias': [num_classes]}}``, the
  same shapes for every architecture with the same ``rep_dim`` (so headers can be
  averaged across CNN-1..5, as LG-FedAvg does).

  Attributes:
    num_classes: number of classes C.
    dtype: computation dtype; parameters are always float32.
  """
  num_classes: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, rep: jax.Array) -> jax.Array:
    """Logits [B, C] of a representation [B, rep_dim]."""
    return dense(rep.astype(self.dtype), self.num_classes, name="fc", dtype=self.dtype)


class CNN(nn.Module):
  """Extractor + header, with params ``{'extractor': {...}, 'header': {...}}``.

  Algorithms share or swap exactly these two subtrees (LG-FedAvg shares headers, FedMoE
  an extractor, FedMRL mixes representations). Entry points:

  - ``apply(v, x)`` -> ``(logits, features)``;
  - ``apply(v, x, method=CNN.extract)`` -> rep [B, rep_dim];
  - ``apply(v, rep, method=CNN.classify)`` -> logits, e.g. of a fused representation.

  Attributes:
    conv_features: see ``CNNExtractor``.
    fc_features: see ``CNNExtractor``.
    num_classes: number of classes C.
    rep_dim: representation width (input width of the header).
    dtype: computation dtype; parameters are always float32.
  """
  conv_features: tuple[int, ...]
  fc_features: tuple[int, ...]
  num_classes: int
  rep_dim: int = 500
  dtype: Any = jnp.float32

  def setup(self):
    self.extractor = CNNExtractor(self.conv_features, self.fc_features, self.rep_dim,
                                  self.dtype)
    self.header = Header(self.num_classes, self.dtype)

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Logits and named features of normalized images.

    Args:
      x: float images [B, 32, 32, 3], already normalized.

    Returns:
      ``(logits [B, C], features)``; features holds the extractor's features
      (``'conv1'``, ``'conv2'``, ``'fc1'``, ``'rep'``) and ``'logits'``.
    """
    rep, feats = self.extractor(x)
    logits = self.header(rep)
    return logits, dict(feats, logits=logits)

  def extract(self, x: jax.Array) -> jax.Array:
    """Representation [B, rep_dim] of normalized images [B, 32, 32, 3]."""
    return self.extractor(x)[0]

  def classify(self, rep: jax.Array) -> jax.Array:
    """Header logits [B, C] of a representation [B, rep_dim]."""
    return self.header(rep)


def extract(model: CNN, params: PyTree, x: jax.Array) -> jax.Array:
  """Runs only ``model``'s extractor.

  Args:
    model: a ``CNN``.
    params: its full params tree ``{'extractor': ..., 'header': ...}`` (only the
      extractor subtree is read).
    x: normalized images [B, 32, 32, 3].

  Returns:
    rep [B, rep_dim] in the model's dtype.
  """
  return model.apply({"params": params}, x, method=CNN.extract)


def classify(model: CNN, params: PyTree, rep: jax.Array) -> jax.Array:
  """Runs only ``model``'s header, e.g. on a fused representation.

  Args:
    model: a ``CNN``.
    params: its full params tree (only the header subtree is read).
    rep: [B, rep_dim].

  Returns:
    logits [B, C] in the model's dtype.
  """
  return model.apply({"params": params}, rep, method=CNN.classify)
