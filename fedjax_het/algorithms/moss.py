r"""Moss: proxy model-based full-weight aggregation for heterogeneous models.

"Moss: Proxy Model-based Full-Weight Aggregation in Federated Learning with Heterogeneous
Models" (arXiv 2503.10218). The paper gives no code; docs/moss.md records which parts
below are the paper's and which are our design (the WIRE meta-networks, the public set).

Symbols (paper -> code):
- device types: the architecture groups of ``rt.layout``; w_g, the type model of group g
  (``server['types'][g]``), is trained by FedAvg within the type.
- PROM: one proxy p_g per type, all of architecture ``proxy_arch`` (default the largest
  device architecture); P, the global proxy (``server['proxy']``).
- WIRE (``moss_wire.transfer``): weight-wise transfer type -> proxy (p_g from w_g, starting
  at P) and global proxy -> type (w_g from P), on the server's public data, guided by the
  transfer-location network T_L and transfer-degree network T_D
  (``server['wire'][g]['up' | 'down']``).
- FILE: fidelity f_g = mean_x cos(p_g(x), w_g(x)) over public x (logits);
  P = sum_g a_g p_g with a_g = relu(f_g) / sum_h relu(f_h).

Uplink: the device model's weights only. Downlink: the deployed type model. Both are
counted per participating client, averaged over the clients of all types.

Protocol: a client downloads w_g (``server['types'][g]``), runs FedAvg's local step
(``shared.local_update``) and uploads its trained w_k; the server's ``aggregate`` runs the
per-type weighted mean (a type without any upload keeps its model), WIRE up, FILE and
WIRE down on its public images (``Protocol.server_data``).

Ablations: ``aggregation='uniform'`` (a_g = 1/G), ``mapping='naive'`` (HeteroFL-style
slice copy instead of WIRE), ``public_domain='synthetic'`` (the public set from another
domain: smooth random colour fields, ``synthetic_images``, instead of held-out images of
the clients' dataset; the paper's Sec. 4.9.1 claim that an unrelated set still works).

Types have different architectures, so WIRE runs in a Python loop over types inside the
traced round (one compiled program, no vmap over types); its steps are a ``lax.scan``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import moss_wire as wire
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.shared import count_rounds
from fedjax_het.algorithms.shared import local_update
from fedjax_het.data.sources import IMAGE_SHAPE
from fedjax_het.models.preprocess import normalize

AGGREGATIONS = ("file", "uniform")
MAPPINGS = ("wire", "naive")
PUBLIC_DOMAINS = ("held_out", "synthetic")
PUBLIC_SEED = 0x5EED  # the public set is fixed: fold_in(rng, PUBLIC_SEED), every round


def file_weights(fid: jax.Array, aggregation: str = "file") -> jax.Array:
  """FILE aggregation weights a [G] of fidelities f [G] (uniform if none is positive).

  >>> file_weights(jnp.array([0.5, 1.5, -1.0]))  # -> [0.25, 0.75, 0.]
  """
  fid = jnp.asarray(fid, jnp.float32)
  uniform = jnp.full_like(fid, 1.0 / fid.shape[0])
  if aggregation == "uniform":
    return uniform
  pos = jnp.maximum(fid, 0.0)
  total = jnp.sum(pos)
  return jnp.where(total > 0, pos / jnp.maximum(total, 1e-12), uniform)


def public_indices(data, key: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  """The server's public set: ``size`` pool indices, unreferenced examples first.

  Returns:
    (int32 [size] indices into the pool, fraction of them some client also holds).
  """
  pool = data.y.shape[0]
  used = jnp.zeros((pool,), jnp.bool_)
  for index in data.groups:
    for idx, mask in ((index.train_idx, index.train_mask), (index.test_idx, index.test_mask)):
      used = used.at[idx.reshape(-1)].max(mask.reshape(-1))
  score = jax.random.uniform(key, (pool,)) + used.astype(jnp.float32)
  order = jnp.argsort(score)[:size].astype(jnp.int32)
  return order, jnp.mean(used[order].astype(jnp.float32))


def synthetic_images(key: jax.Array, size: int, image_shape: tuple[int, ...],
                     cells: int = 4) -> jax.Array:
  """``size`` uint8 images [size, H, W, C] of another domain than any dataset's: uniform
  random colours on a ``cells`` x ``cells`` grid, bilinearly upsampled to H x W, plus
  pixel noise of standard deviation 8 (smooth colour fields with texture)."""
  h, w, c = image_shape
  coarse_key, noise_key = jax.random.split(key)
  coarse = jax.random.uniform(coarse_key, (size, cells, cells, c), minval=0.0,
                              maxval=255.0)
  smooth = jax.image.resize(coarse, (size, h, w, c), "bilinear")
  noisy = smooth + 8.0 * jax.random.normal(noise_key, (size, h, w, c))
  return jnp.clip(jnp.round(noisy), 0, 255).astype(jnp.uint8)


def uplink(params):
  """What a Moss client sends: its trained device-model weights, nothing else."""
  return params


def largest_arch(archs, num_classes: int, image_shape: tuple[int, ...] = IMAGE_SHAPE) -> str:
  """The architecture among ``archs`` with the most parameters (on images of a shape)."""
  def size(a):
    net = models.get_model(a, num_classes=num_classes)
    return models.count_params(jax.eval_shape(net.init, jax.random.PRNGKey(0),
                                              dummy_input(image_shape)))
  return max(archs, key=size)


def moss(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
         weight_decay: float = 0.0, grad_clip: float = 0.0,
         proxy_arch: str = "auto", aggregation: str = "file", mapping: str = "wire",
         public_size: int = 500, public_batch: int = 50, wire_steps: int = 10,
         wire_lr: float = 0.01, meta_lr: float = 1e-3, beta: float = 0.5,
         wire_layers: str = "conv1,conv2,rep",
         public_domain: str = "held_out", wire_clip: float = 0.0) -> api.Algorithm:
  """Builds Moss.

  Args:
    rt: runtime (groups by architecture = device types).
    learning_rate, momentum: local SGD (optimizer state reset every round, as FedAvg).
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    proxy_arch: architecture of the proxies; 'auto' = the largest device architecture.
    aggregation: 'file' (fidelity-weighted) or 'uniform'.
    mapping: 'wire' or 'naive' (slice copy).
    public_size: examples of the server's public set.
    public_batch: public examples per WIRE step.
    wire_steps: WIRE steps per type, direction and round.
    wire_lr, meta_lr, beta: WIRE's SGD step, T_L/T_D Adam step, weight of L_wfm.
    wire_layers: comma-separated feature names matched by WIRE.
    public_domain: 'held_out' (``public_size`` images of the clients' dataset that no
      client holds) or 'synthetic' (``public_size`` ``synthetic_images``).
    wire_clip: global-norm bound of WIRE's SGD steps' gradients (``WireConfig.clip``);
      0: none.

  Returns:
    ``Algorithm``; see docs/moss.md for ``state.server``; ``state.clients[g]`` counts the
    rounds each client of group g took part in (int32 [n_g]).
  """
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"algo.aggregation={aggregation!r}; valid: {AGGREGATIONS}")
  if mapping not in MAPPINGS:
    raise ValueError(f"algo.mapping={mapping!r}; valid: {MAPPINGS}")
  if public_domain not in PUBLIC_DOMAINS:
    raise ValueError(f"algo.public_domain={public_domain!r}; valid: {PUBLIC_DOMAINS}")
  for k, v in dict(public_size=public_size, public_batch=public_batch,
                   wire_steps=wire_steps).items():
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"algo.{k}={v!r} must be a positive int")
  check_wire_clip(wire_clip)
  nc, layout = rt.layout.num_classes, rt.layout
  proxy_arch = (largest_arch(layout.archs, nc, layout.image_shape) if proxy_arch == "auto"
                else proxy_arch)
  nets = [models.get_model(a, num_classes=nc, dtype=rt.compute_dtype) for a in layout.archs]
  proxy_net = models.get_model(proxy_arch, num_classes=nc, dtype=rt.compute_dtype)
  applies = [lambda p, x, n=n: n.apply({"params": p}, x) for n in nets]
  proxy_apply = lambda p, x: proxy_net.apply({"params": p}, x)
  layers = tuple(s.strip() for s in wire_layers.split(",") if s.strip())
  opt, meta_opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip), optax.adam(meta_lr)
  G = layout.num_groups

  def init_params(net, key):
    return net.init(key, rt.dummy_input())["params"]

  def shapes(net):
    return jax.eval_shape(lambda k: init_params(net, k), jax.random.PRNGKey(0))

  c_proxy = wire.channels(proxy_apply, shapes(proxy_net), layers, layout.image_shape)
  c_types = [wire.channels(applies[g], shapes(nets[g]), layers, layout.image_shape)
             for g in range(G)]

  def init_wire(key, c_src, c_tgt):
    meta = wire.init_meta(c_src, layers)
    return {"meta": meta, "meta_opt": meta_opt.init(meta),
            "reg": wire.init_regressors(key, c_src, c_tgt, layers)}

  def init_server(rng):
    skey = jax.random.fold_in(rng, 1 << 20)
    types = tuple(init_params(nets[g], jax.random.fold_in(skey, g)) for g in range(G))
    proxy = init_params(proxy_net, jax.random.fold_in(skey, G))
    wires = ()
    if mapping == "wire":
      wkey = jax.random.fold_in(skey, G + 1)
      wires = tuple({"up": init_wire(jax.random.fold_in(wkey, 2 * g), c_types[g], c_proxy),
                     "down": init_wire(jax.random.fold_in(wkey, 2 * g + 1), c_proxy,
                                       c_types[g])} for g in range(G))
    return {"types": types, "proxy": proxy, "wire": wires}

  cfg = wire.WireConfig(layers, wire_steps, public_batch, wire_lr, beta, float(wire_clip))

  def map_weights(src_apply, src, tgt_apply, tgt, ws, public_x, key):
    """One direction of WIRE (or the naive copy): returns (target, wire state, loss)."""
    if mapping == "naive":
      return wire.naive_copy(src, tgt), ws, jnp.zeros(())
    c = cfg._replace(batch=min(cfg.batch, public_x.shape[0]))
    return wire.transfer(c, meta_opt, src_apply, src, tgt_apply, tgt, ws, public_x, key)

  def map_types(direction, pairs, wires, public_x, key, offset):
    """One WIRE direction for every type g, ``pairs[g] = (src_apply, src, tgt_apply, tgt)``.

    Returns:
      (targets per type, wire states with ``direction`` updated, losses per type).
    """
    targets, new_wires, losses = [], [], []
    for g, pair in enumerate(pairs):
      t, ws, loss = map_weights(*pair, wires[g].get(direction), public_x,
                                jax.random.fold_in(key, offset + g))
      targets.append(t)
      new_wires.append(dict(wires[g], **{direction: ws}) if mapping == "wire" else wires[g])
      losses.append(loss)
    return targets, new_wires, losses

  def server_aggregate(server, uploads, weights, train_key, public):
    public_x, overlap = public  # ``public_set``: fixed across rounds
    wire_key = jax.random.fold_in(train_key, 1 << 16)
    types = [type_average(u, n, w) for u, n, w in zip(uploads, weights, server["types"])]
    wires = list(server["wire"]) if mapping == "wire" else [{} for _ in range(G)]
    # ---- WIRE up: type g -> proxy p_g (starting from the global proxy), then fidelity
    up = [(applies[g], types[g], proxy_apply, server["proxy"]) for g in range(G)]
    proxies, wires, up_losses = map_types("up", up, wires, public_x, wire_key, 0)
    fid = jnp.stack([wire.fidelity(proxy_apply(p, public_x)[0],
                                   applies[g](types[g], public_x)[0])
                     for g, p in enumerate(proxies)])
    # ---- FILE: fidelity-weighted global proxy
    a = file_weights(fid, aggregation)
    proxy = cl.weighted_mean(jax.tree.map(lambda *x: jnp.stack(x), *proxies), a)
    # ---- WIRE down: global proxy -> every type, deployed next round
    down = [(proxy_apply, proxy, applies[g], types[g]) for g in range(G)]
    new_types, wires, down_losses = map_types("down", down, wires, public_x, wire_key, G)
    new = {"types": tuple(new_types), "proxy": proxy,
           "wire": tuple(wires) if mapping == "wire" else ()}
    return new, {"fidelity": fid, "file_weights": a,
                 "wire_loss": jnp.mean(jnp.stack(up_losses + down_losses)),
                 "public_overlap": overlap}

  def public_set(data, rng):
    """The public images (normalized) and the fraction of them some client holds; the
    same every round (``fold_in(rng, PUBLIC_SEED)``)."""
    key = jax.random.fold_in(rng, PUBLIC_SEED)
    if public_domain == "synthetic":
      images = synthetic_images(key, public_size, layout.image_shape)
      overlap = jnp.zeros((), jnp.float32)
    else:
      idx, overlap = public_indices(data, key, min(public_size, data.y.shape[0]))
      images = data.x[idx]
    return normalize(images, rt.normalization).astype(rt.compute_dtype), overlap

  def predict(g, rounds_taken, w_g):
    del rounds_taken  # the deployed type model
    return lambda x: applies[g](w_g, x)[0]

  def communication(server, uploads, weights, aux):
    """Each way, the deployed type model: its size averaged over the expected clients
    of every type (static)."""
    del uploads, weights, aux
    sizes = [api.count_params(t) for t in server["types"]]
    sampled = [rt.expected_sampled(g) for g in range(G)]
    per_client = float(np.dot(sizes, sampled) / sum(sampled))
    return per_client, per_client

  proto = api.Protocol(
      count_rounds, init_server, lambda server, g: server["types"][g],
      local_update(rt, nets, opt), server_aggregate, predict,
      server_data=public_set, trained_payload=api.own_upload,
      communication=communication)
  return rounds.from_protocol(rt, proto)


def type_average(uploads, weights: jax.Array, previous):
  """FedAvg within a type: w_g = sum_k n_k w_k / sum_k n_k over its uploads [m_g, ...].

  A type whose uploads all weigh 0 (in a deployment: every client of it failed) keeps
  ``previous``, its model of the last round, rather than becoming zeros.
  """
  return cl.select_tree(jnp.sum(weights) > 0, cl.weighted_mean(uploads, weights), previous)


def check_wire_clip(wire_clip) -> None:
  """``algo.wire_clip`` is a number >= 0 (0: WIRE's steps are not clipped)."""
  if isinstance(wire_clip, bool) or not isinstance(wire_clip, (int, float)) or wire_clip < 0:
    raise ValueError(f"algo.wire_clip={wire_clip!r} must be a number >= 0 (0: no clip)")


def check_config(config) -> None:
  """What Moss checks of a config before any data is read: ``algo.wire_clip`` and the
  public set (``check_public``)."""
  check_wire_clip(config.algo.get("wire_clip", SPEC.hparams["wire_clip"]))
  check_public(config)


def check_public(config) -> None:
  """Moss needs a public set that no client holds: ``data.public >= algo.public_size``.

  Without it the public images would be drawn from the clients' own (test) examples.
  """
  size = config.algo.get("public_size", SPEC.hparams["public_size"])
  if config.algo.get("public_domain", "held_out") == "synthetic":
    return  # no image of the dataset is public
  if config.data.public < size:
    raise ValueError(
        f"config.data.public={config.data.public} is invalid: Moss needs a public set no "
        f"client holds, data.public >= algo.public_size={size} (set "
        f"--config.data.public={size}); with less it would use clients' test images")


SPEC = api.Spec(
    lambda c, rt: moss(rt, **api.sgd_args(c), **c.algo),
    api.hparams_of(moss),
    choices=dict(proxy_arch=models.ArchitectureChoices(extra=("auto",)),
                 aggregation=AGGREGATIONS, mapping=MAPPINGS,
                 public_domain=PUBLIC_DOMAINS),
    check=lambda c: check_config(c))
