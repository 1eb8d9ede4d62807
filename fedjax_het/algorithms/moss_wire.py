r"""WIRE of Moss: weight-wise knowledge transfer guided by two meta-networks.

Design after Jang et al., "Learning What and Where to Transfer" (ICML 2019); Moss
(arXiv 2503.10218) names the transfer-location network T_L and the transfer-degree
network T_D but does not specify them (see docs/moss.md for what is ours).

Symbols (docs -> code):
- S^m(x), T^n(x): source layer m / target layer n features, pooled to [B, P, C]
  (``pooled_features``; P = 4 for conv layers on a 2x2 grid, 1 for FC layers).
- r_{nm}: regressor C_n -> C_m at every position (``reg[n][m]``).
- T_L: lambda[b, n, :] = softmax_m(B[n, m] + gap(S^m) . V_m[:, n]) (``location``).
- T_D: w^{nm}[b, :] = softmax(gap(S^m) W_{nm} + c_{nm}) (``degree``).
- L_wfm = sum_{n,m} mean_b lambda[b,n,m] sum_c w^{nm}[b,c] mean_p (r(T^n) - S^m)^2.
- L = L_kd + beta L_wfm; meta step: grad_phi L_kd(theta - lr grad_theta L); with
  ``WireConfig.clip``, each gradient of an SGD step clipped to that global norm.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any
Apply = Callable[[PyTree, jax.Array], tuple[jax.Array, dict]]


class WireConfig(NamedTuple):
  """Static settings of one WIRE run.

  Attributes:
    layers: feature names matched (both source and target must have them).
    steps: WIRE steps (``lax.scan``).
    batch: public examples per step.
    lr: SGD step of the target and regressors (and of the look-ahead).
    beta: weight of L_wfm.
    clip: global-norm bound of each SGD step's gradient (of the target and regressors
      together; of the target alone in the look-ahead); 0: none, as the runs of
      docs/claims.md (WIRE's L_wfm can grow without bound: docs/moss.md).
  """
  layers: tuple[str, ...]
  steps: int
  batch: int
  lr: float
  beta: float
  clip: float = 0.0


def pool_feature(f: jax.Array) -> jax.Array:
  """[B,H,W,C] -> 2x2 average grid [B,4,C]; [B,C] -> [B,1,C] (float32)."""
  f = f.astype(jnp.float32)
  if f.ndim == 2:
    return f[:, None, :]
  b, h, w, c = f.shape
  f = f[:, :h - h % 2, :w - w % 2]
  return f.reshape(b, 2, h // 2, 2, w // 2, c).mean((2, 4)).reshape(b, 4, c)


def pooled_features(feats: dict, layers) -> dict:
  """``pool_feature`` of the named layers."""
  return {k: pool_feature(feats[k]) for k in layers}


def channels(apply: Apply, params: PyTree, layers,
             image_shape: tuple[int, ...] = (32, 32, 3)) -> dict:
  """Channel count of each named layer (shape-only evaluation on one image)."""
  feats = jax.eval_shape(lambda p: apply(p, jnp.zeros((1,) + tuple(image_shape)))[1], params)
  missing = [k for k in layers if k not in feats]
  if missing:
    raise ValueError(f"algo.wire_layers: {missing} not among the model's features "
                     f"{sorted(k for k in feats if k != 'logits')}")
  return {k: feats[k].shape[-1] for k in layers}


def init_meta(c_src: dict, layers) -> PyTree:
  """T_L and T_D parameters phi, zero (uniform distributions at the start)."""
  z = jnp.zeros
  return {"loc_b": z((len(layers), len(layers))),
          "loc_w": {m: z((c_src[m], len(layers))) for m in layers},
          "deg": {n: {m: {"w": z((c_src[m], c_src[m])), "b": z((c_src[m],))}
                      for m in layers} for n in layers}}


def init_regressors(key: jax.Array, c_src: dict, c_tgt: dict, layers) -> PyTree:
  """Regressors r_{nm}: LeCun-normal kernels [C_n, C_m], zero biases."""
  init = jax.nn.initializers.lecun_normal()
  out = {}
  for i, n in enumerate(layers):
    out[n] = {}
    for j, m in enumerate(layers):
      k = jax.random.fold_in(key, i * len(layers) + j)
      out[n][m] = {"k": init(k, (c_tgt[n], c_src[m])), "b": jnp.zeros((c_src[m],))}
  return out


def location(meta: PyTree, src: dict, layers) -> jax.Array:
  """T_L: float32 [B, N_target, M_source], each row a distribution over source layers."""
  logits = meta["loc_b"][None] + jnp.stack(
      [src[m].mean(1) @ meta["loc_w"][m] for m in layers], axis=-1)  # [B, N, M]
  return jax.nn.softmax(logits, axis=-1)


def degree(meta: PyTree, src: dict, layers) -> dict:
  """T_D: ``{n: {m: [B, C_m]}}`` channel distributions of each pair."""
  return {n: {m: jax.nn.softmax(src[m].mean(1) @ meta["deg"][n][m]["w"]
                                + meta["deg"][n][m]["b"], axis=-1) for m in layers}
          for n in layers}


def matching_loss(tgt: dict, src: dict, reg: PyTree, meta: PyTree, layers) -> jax.Array:
  """L_wfm: T_L- and T_D-weighted feature matching through the regressors."""
  lam, w = location(meta, src, layers), degree(meta, src, layers)
  total = 0.0
  for i, n in enumerate(layers):
    for j, m in enumerate(layers):
      t, s = tgt[n], src[m]
      if t.shape[1] != s.shape[1]:  # conv vs FC: compare at one position
        t, s = t.mean(1, keepdims=True), s.mean(1, keepdims=True)
      r = t @ reg[n][m]["k"] + reg[n][m]["b"]
      err = jnp.mean((r - s) ** 2, axis=1)  # [B, C_m]
      total = total + jnp.mean(lam[:, i, j] * jnp.sum(w[n][m] * err, axis=-1))
  return total


def distillation(tgt_logits: jax.Array, src_logits: jax.Array) -> jax.Array:
  """L_kd: cross-entropy of the target's logits to the source's softmax (mean over B)."""
  p = jax.nn.softmax(src_logits.astype(jnp.float32))
  return -jnp.mean(jnp.sum(p * jax.nn.log_softmax(tgt_logits.astype(jnp.float32)), -1))


def fidelity(a_logits: jax.Array, b_logits: jax.Array) -> jax.Array:
  """Mean over examples of cos(a_b, b_b) of two logits arrays [B, C]."""
  a, b = a_logits.astype(jnp.float32), b_logits.astype(jnp.float32)
  num = jnp.sum(a * b, -1)
  den = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.mean(num / jnp.maximum(den, 1e-12))


def transfer(cfg: WireConfig, meta_opt: optax.GradientTransformation,
             src_apply: Apply, src_params: PyTree, tgt_apply: Apply, tgt_params: PyTree,
             wire_state: PyTree, public_x: jax.Array, key: jax.Array):
  """Trains the target from the source on public images (``cfg.steps`` WIRE steps).

  Args:
    cfg: static settings.
    meta_opt: optimizer of phi (Adam).
    src_apply, tgt_apply: ``(params, x) -> (logits, features)``.
    src_params: the source (fixed).
    tgt_params: the target's starting point theta.
    wire_state: ``{'meta': phi, 'meta_opt': state, 'reg': regressors}``.
    public_x: normalized public images [N, H, W, C].
    key: PRNG key choosing each step's minibatch.

  Returns:
    ``(theta, wire_state, mean inner loss)``.
  """
  layers = cfg.layers

  def clipped(grads):
    if not cfg.clip:
      return grads
    return optax.clip_by_global_norm(cfg.clip).update(grads, optax.EmptyState())[0]

  def source(x):
    logits, feats = src_apply(src_params, x)
    return jax.lax.stop_gradient((logits, pooled_features(feats, layers)))

  def inner(theta, reg, meta, x, s_logits, s_feats):
    logits, feats = tgt_apply(theta, x)
    wfm = matching_loss(pooled_features(feats, layers), s_feats, reg, meta, layers)
    return distillation(logits, s_logits) + cfg.beta * wfm

  def meta_objective(meta, theta, reg, x, s_logits, s_feats):
    g = clipped(jax.grad(inner)(theta, reg, meta, x, s_logits, s_feats))
    ahead = jax.tree.map(lambda p, d: p - cfg.lr * d, theta, g)
    return distillation(tgt_apply(ahead, x)[0], s_logits)

  def step(carry, skey):
    theta, ws = carry
    idx = jax.random.choice(skey, public_x.shape[0], (cfg.batch,), replace=False)
    x = public_x[idx]
    s_logits, s_feats = source(x)
    g_meta = jax.grad(meta_objective)(ws["meta"], theta, ws["reg"], x, s_logits, s_feats)
    upd, opt_state = meta_opt.update(g_meta, ws["meta_opt"], ws["meta"])
    meta = optax.apply_updates(ws["meta"], upd)
    loss, (g_t, g_r) = jax.value_and_grad(inner, argnums=(0, 1))(
        theta, ws["reg"], meta, x, s_logits, s_feats)
    g_t, g_r = clipped((g_t, g_r))
    sgd = lambda p, d: p - cfg.lr * d
    theta, reg = jax.tree.map(sgd, theta, g_t), jax.tree.map(sgd, ws["reg"], g_r)
    return (theta, {"meta": meta, "meta_opt": opt_state, "reg": reg}), loss

  (theta, ws), losses = jax.lax.scan(step, (tgt_params, wire_state),
                                     jax.random.split(key, cfg.steps))
  return theta, ws, jnp.mean(losses)


def naive_copy(src_params: PyTree, tgt_params: PyTree) -> PyTree:
  """HeteroFL-style mapping: each target tensor gets the source's overlapping slice.

  Tensors whose path is missing in the source, or whose rank differs, are kept.
  """
  src = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(src_params)}

  def copy(path, t):
    s = src.get(jax.tree_util.keystr(path))
    if s is None or s.ndim != t.ndim:
      return t
    sl = tuple(slice(0, min(a, b)) for a, b in zip(s.shape, t.shape))
    return t.at[sl].set(s[sl].astype(t.dtype))

  return jax.tree_util.tree_map_with_path(copy, tgt_params)
