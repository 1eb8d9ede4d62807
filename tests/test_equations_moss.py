"""Moss's equations (arXiv 2503.10218; WIRE after Jang et al., ICML 2019) by hand.

- a client's step: FedAvg's SGD on the downloaded type model, which it uploads whole;
- the server (``Protocol.aggregate`` with the naive mapping, so every expected tensor is a
  weighted mean or a slice copy one can write down): the per-type mean weighted by the
  uploads' counts, the proxies, the FILE fidelities and weights, the global proxy, and the
  reverse transfer of the global proxy into every type;
- WIRE's matching loss L_wfm on a toy pair of two-layer feature sets, against loops over
  samples and channels;
- one WIRE step on a toy pair of two-layer networks: the look-ahead meta-gradient, the
  meta-step and the SGD step of the target and regressors, against ``jax.grad`` of the
  recomputed objectives.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from by_hand import assert_close
from by_hand import ce
from by_hand import normalized
from by_hand import one_batch
from by_hand import pool
from by_hand import runtime
from by_hand import sgd

from fedjax_het import models
from fedjax_het.algorithms import moss as moss_lib
from fedjax_het.algorithms import moss_wire as wire

pytestmark = pytest.mark.usefixtures("compile_bound")

NETS = {a: models.get_model(a, num_classes=10) for a in ("tiny", "tiny2")}


def logits(arch, params, x):
  return NETS[arch].apply({"params": params}, x)[0]


def init(arch, seed):
  return NETS[arch].init(jax.random.PRNGKey(seed), jnp.zeros((1, 16, 16, 3)))["params"]


def slice_copy(src, tgt):
  """HeteroFL's mapping by hand: every target tensor takes the source's overlapping
  corner where both have the tensor with the same rank."""
  flat = {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_leaves_with_path(src)}

  def copy(path, t):
    t = np.array(t)
    s = flat.get(jax.tree_util.keystr(path))
    if s is not None and s.ndim == t.ndim:
      corner = tuple(slice(0, min(a, b)) for a, b in zip(s.shape, t.shape))
      t[corner] = s[corner]
    return t
  return jax.tree_util.tree_map_with_path(copy, tgt)


def cosine_fidelity(a, b):
  """mean_x cos(a(x), b(x)) of logits [N, C]."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.mean(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1)
                       / np.linalg.norm(b, axis=-1)))


def test_a_client_uploads_one_sgd_step_of_its_type_model():
  lr, n = 0.1, 4
  proto = moss_lib.moss(runtime(archs=("tiny2",), batch_size=n), learning_rate=lr,
                        public_size=8).protocol
  w = jax.jit(init, static_argnums=0)("tiny2", 3)
  data = pool(n, seed=2)
  idx, mask = one_batch(n)
  rounds, upload, aux = jax.jit(proto.client_update, static_argnums=0)(
      0, jnp.int32(2), w, data, idx, mask, jax.random.PRNGKey(0))
  x = normalized(data.x)
  value, grads = jax.jit(jax.value_and_grad(lambda p: ce(logits("tiny2", p, x), data.y)))(w)
  assert int(rounds) == 3  # the client counts its rounds
  np.testing.assert_allclose(aux["loss"], value, rtol=1e-5)
  assert_close(upload, sgd(w, grads, lr), rtol=1e-4, atol=1e-6)  # the whole device model
  assert not np.allclose(jax.tree.leaves(upload)[-1], jax.tree.leaves(w)[-1])


def test_naive_aggregation_is_file_weighted_means_and_slice_copies():
  """Two types: 'tiny' (2 uploads of weights 3 and 1; the proxies' architecture, the
  larger) and 'tiny2' (1 upload)."""
  proto = moss_lib.moss(runtime(archs=("tiny", "tiny2"), clients=(2, 1)),
                        learning_rate=0.1, mapping="naive", aggregation="file",
                        public_size=8).protocol
  server = jax.jit(proto.init_server)(jax.random.PRNGKey(0))
  p = jax.jit(init, static_argnums=0)
  ups = [[p("tiny", 11), p("tiny", 12)], [p("tiny2", 13)]]
  counts = [np.array([3.0, 1.0], np.float32), np.array([2.0], np.float32)]
  stacked = tuple(jax.tree.map(lambda *a: jnp.stack(a), *u) for u in ups)
  x = normalized(pool(8, seed=7).x)
  new, metrics = jax.jit(proto.aggregate)(server, stacked, tuple(counts),
                                          jax.random.PRNGKey(1), (x, jnp.float32(0.25)))
  assert float(metrics["public_overlap"]) == 0.25  # the server data's, reported as is
  # the type models: FedAvg within each type, weighted by the counts
  w0 = jax.tree.map(lambda a, b: (3 * np.asarray(a) + np.asarray(b)) / 4, *ups[0])
  w1 = jax.tree.map(np.asarray, ups[1][0])
  # WIRE up, naive: each proxy is the global proxy with its type's corner copied in
  proxies = [slice_copy(w0, server["proxy"]), slice_copy(w1, server["proxy"])]
  assert_close(proxies[0], w0, 0, 0)  # same architecture: all of it
  run = jax.jit(logits, static_argnums=0)
  fid = np.array([cosine_fidelity(run("tiny", proxies[0], x), run("tiny", w0, x)),
                  cosine_fidelity(run("tiny", proxies[1], x), run("tiny2", w1, x))])
  np.testing.assert_allclose(metrics["fidelity"], fid, rtol=1e-5, atol=1e-6)
  assert fid[1] > 0 and abs(fid[0] - fid[1]) > 0.05, fid  # FILE weights differ from 1/2
  a = np.maximum(fid, 0) / np.maximum(fid, 0).sum()
  np.testing.assert_allclose(metrics["file_weights"], a, rtol=1e-5)
  # FILE: the global proxy is the fidelity-weighted mean of the proxies
  proxy = jax.tree.map(lambda u, v: a[0] * u + a[1] * v, *proxies)
  assert_close(new["proxy"], proxy, rtol=1e-5, atol=1e-6)
  # the reverse transfer: every type model takes the global proxy's corner
  assert_close(new["types"][0], proxy, rtol=1e-5, atol=1e-6)
  assert_close(new["types"][1], slice_copy(proxy, w1), rtol=1e-5, atol=1e-6)
  for g in range(2):  # the downlink of a type is its new model
    assert_close(proto.downlink(new, g), new["types"][g], 0, 0)
  assert new["wire"] == ()  # the naive mapping keeps no WIRE state
  # the ablation aggregation='uniform': a = (1/2, 1/2) whatever the fidelities
  uniform = moss_lib.moss(runtime(archs=("tiny", "tiny2"), clients=(2, 1)),
                          learning_rate=0.1, mapping="naive", aggregation="uniform",
                          public_size=8).protocol
  new, metrics = jax.jit(uniform.aggregate)(server, stacked, tuple(counts),
                                            jax.random.PRNGKey(1), (x, jnp.float32(0.0)))
  np.testing.assert_allclose(metrics["file_weights"], [0.5, 0.5])
  np.testing.assert_allclose(metrics["fidelity"], fid, rtol=1e-5, atol=1e-6)
  assert_close(new["proxy"], jax.tree.map(lambda u, v: (u + v) / 2, *proxies), rtol=1e-5,
               atol=1e-6)


# ---------------------------------------------------------------- WIRE on toy pairs
LAYERS = ("a", "b")


def wfm_loops(tgt, src, reg, meta):
  """L_wfm with explicit loops over samples, layer pairs and channels (numpy float64).

  tgt[n], src[m]: [B, P, C] pooled features; lambda[b, n, :] = softmax_m(B[n, m] +
  mean_p src[m][b] . V_m[:, n]); w^{nm}[b] = softmax_c(mean_p src[m][b] W_nm + c_nm);
  L = sum_{n,m} mean_b lambda[b,n,m] sum_c w^{nm}[b,c] mean_p (r_nm(T^n) - S^m)^2, a
  conv feature compared with an FC one at its mean position.
  """
  f = lambda t: jax.tree.map(lambda a: np.asarray(a, np.float64), t)  # noqa: E731
  tgt, src, reg, meta = f(tgt), f(src), f(reg), f(meta)
  softmax = lambda v: np.exp(v - v.max()) / np.exp(v - v.max()).sum()  # noqa: E731
  batch = src[LAYERS[0]].shape[0]
  total = 0.0
  for b in range(batch):
    gap = {m: src[m][b].mean(0) for m in LAYERS}
    for i, n in enumerate(LAYERS):
      lam = softmax(np.array([meta["loc_b"][i, j] + gap[m] @ meta["loc_w"][m][:, i]
                              for j, m in enumerate(LAYERS)]))
      for j, m in enumerate(LAYERS):
        w = softmax(gap[m] @ meta["deg"][n][m]["w"] + meta["deg"][n][m]["b"])
        t, s = tgt[n][b], src[m][b]
        if t.shape[0] != s.shape[0]:
          t, s = t.mean(0, keepdims=True), s.mean(0, keepdims=True)
        r = t @ reg[n][m]["k"] + reg[n][m]["b"]
        err = ((r - s) ** 2).mean(0)  # [C_m]
        total += lam[j] * np.sum(w * err) / batch
  return total


def wfm(tgt, src, reg, meta):
  """``wfm_loops`` vectorized in jax (differentiable), for the WIRE step below."""
  gap = {m: src[m].mean(1) for m in LAYERS}
  lam = jax.nn.softmax(meta["loc_b"][None] + jnp.stack(
      [gap[m] @ meta["loc_w"][m] for m in LAYERS], -1), -1)  # [B, N, M]
  total = 0.0
  for i, n in enumerate(LAYERS):
    for j, m in enumerate(LAYERS):
      w = jax.nn.softmax(gap[m] @ meta["deg"][n][m]["w"] + meta["deg"][n][m]["b"], -1)
      t, s = tgt[n], src[m]
      if t.shape[1] != s.shape[1]:
        t, s = t.mean(1, keepdims=True), s.mean(1, keepdims=True)
      err = jnp.mean((t @ reg[n][m]["k"] + reg[n][m]["b"] - s) ** 2, 1)
      total = total + jnp.mean(lam[:, i, j] * jnp.sum(w * err, -1))
  return total


def toy_meta_and_reg(c_src, c_tgt, seed):
  """Random (not zero) T_L, T_D and regressors, so every term of L_wfm counts."""
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 32))
  r = lambda *s: 0.5 * jax.random.normal(next(keys), s)  # noqa: E731
  meta = {"loc_b": r(2, 2), "loc_w": {m: r(c_src[m], 2) for m in LAYERS},
          "deg": {n: {m: {"w": r(c_src[m], c_src[m]), "b": r(c_src[m])} for m in LAYERS}
                  for n in LAYERS}}
  reg = {n: {m: {"k": r(c_tgt[n], c_src[m]), "b": r(c_src[m])} for m in LAYERS}
         for n in LAYERS}
  return meta, reg


def test_matching_loss_of_a_toy_two_layer_pair_by_loops():
  c_src, c_tgt = {"a": 3, "b": 2}, {"a": 4, "b": 5}
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  src = {"a": jax.random.normal(keys[0], (3, 4, 3)), "b": jax.random.normal(keys[1], (3, 1, 2))}
  tgt = {"a": jax.random.normal(keys[2], (3, 4, 4)), "b": jax.random.normal(keys[3], (3, 1, 5))}
  meta, reg = toy_meta_and_reg(c_src, c_tgt, 1)
  expected = wfm_loops(tgt, src, reg, meta)
  np.testing.assert_allclose(
      jax.jit(lambda *a: wire.matching_loss(*a, LAYERS))(tgt, src, reg, meta), expected,
      rtol=1e-5)
  np.testing.assert_allclose(jax.jit(wfm)(tgt, src, reg, meta), expected, rtol=1e-5)
  # T_L and T_D matter: uniform distributions give another value
  flat = jax.tree.map(jnp.zeros_like, meta)
  assert abs(wfm_loops(tgt, src, reg, flat) - expected) > 1e-3


def mlp(p, x):
  """A two-layer toy network: features 'a' (hidden, tanh) and 'b' (logits)."""
  h = jnp.tanh(x @ p["w1"])
  out = h @ p["w2"]
  return out, {"a": h, "b": out}


def kd(t_logits, s_logits):
  """L_kd: CE of the target's logits to the source's softmax."""
  return -jnp.mean(jnp.sum(jax.nn.softmax(s_logits) * jax.nn.log_softmax(t_logits), -1))


def test_one_wire_step_is_the_look_ahead_meta_step_then_sgd():
  """``transfer`` for one step on all 6 public examples, with SGD(1) as the meta
  optimizer (so the meta-step is minus the meta-gradient, readable), against:

    g_phi = grad_phi L_kd(theta - lr grad_theta L(theta, r, phi))   (the look-ahead)
    phi' = phi - g_phi;  (theta', r') = (theta, r) - lr grad L(theta, r, phi')
    L = L_kd + beta L_wfm.
  """
  lr, beta = 0.5, 0.7
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  src = {"w1": jax.random.normal(keys[0], (3, 3)), "w2": jax.random.normal(keys[1], (3, 2))}
  theta = {"w1": jax.random.normal(keys[2], (3, 4)),
           "w2": jax.random.normal(keys[3], (4, 2))}
  x = jax.random.normal(keys[4], (6, 3))
  c_src, c_tgt = {"a": 3, "b": 2}, {"a": 4, "b": 2}
  meta, reg = toy_meta_and_reg(c_src, c_tgt, 2)
  meta_opt = optax.sgd(1.0)
  ws = {"meta": meta, "meta_opt": meta_opt.init(meta), "reg": reg}
  cfg = wire.WireConfig(LAYERS, steps=1, batch=6, lr=lr, beta=beta)
  new_theta, new_ws, loss = jax.jit(lambda t, w: wire.transfer(
      cfg, meta_opt, mlp, src, mlp, t, w, x, jax.random.PRNGKey(4)))(theta, ws)

  s_logits, s_feats = mlp(src, x)
  pooled = lambda f: {k: v[:, None, :] for k, v in f.items()}  # noqa: E731  FC: one position

  def inner(theta, reg, meta):
    t_logits, t_feats = mlp(theta, x)
    return kd(t_logits, s_logits) + beta * wfm(pooled(t_feats), pooled(s_feats), reg, meta)

  def look_ahead(meta):
    ahead = sgd(theta, jax.grad(inner)(theta, reg, meta), lr)
    return kd(mlp(ahead, x)[0], s_logits)

  g_meta = jax.jit(jax.grad(look_ahead))(meta)
  assert max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(g_meta)) > 1e-4
  meta1 = jax.tree.map(lambda p, g: p - g, meta, g_meta)
  value, (g_t, g_r) = jax.jit(jax.value_and_grad(inner, argnums=(0, 1)))(theta, reg, meta1)
  assert_close(new_ws["meta"], meta1, rtol=1e-4, atol=1e-6)
  assert_close(new_theta, sgd(theta, g_t, lr), rtol=1e-4, atol=1e-6)
  assert_close(new_ws["reg"], sgd(reg, g_r, lr), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(loss, value, rtol=1e-5)
