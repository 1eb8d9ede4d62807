"""What several algorithms are built from: models, loss, weighted average, FedAvg's client.

The algorithm modules (``fedavg.py``, ``fedmrl.py``, ...) do not import each other; the
pieces more than one of them uses live here (``class_tables.py``: FedProto's and FD's
per-class tables; ``mutual.py``: the shared-beside-private protocol of FML, FedKD and
FedAPEN). ``api.py`` holds the contract, ``rounds.py`` the machinery.

- ``LOCAL_REP_DIM``: d2 = 500, the representation width of the clients' CNN-1..5.
- ``init_models``, ``classifier_loss``, ``private_client_init``: a
  client's private CNN and its cross-entropy.
- ``weighted_average``: theta <- sum_k n_k theta_k / sum_k n_k over every group's uploads
  (FedAvg's, FedMRL's Eq. 4, pFedMoE's Eq. 6, LG-FedAvg's header, FML's meme, ...).
- ``count_rounds``, ``local_update``: FedAvg's client (also Moss's within-type FedAvg).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.data.sources import IMAGE_SHAPE

LOCAL_REP_DIM = 500  # d2: width of the CNN-1..5 representations


def classifier_loss(model):
  """Cross-entropy loss of a ``models.CNN`` in the ``clients.LossFn`` signature."""
  def loss_fn(params, model_state, batch, rng):
    del rng
    logits, _ = model.apply({"params": params}, batch.x)
    return cl.cross_entropy(logits, batch.y, batch.mask), model_state
  return loss_fn


def init_models(rt: api.Runtime, *, num_classes: int):
  """One ``models.CNN`` per group, in the runtime's compute dtype."""
  return [models.get_model(arch, num_classes=num_classes, dtype=rt.compute_dtype)
          for arch in rt.layout.archs]


def private_client_init(nets, opt, image_shape: tuple[int, ...] = IMAGE_SHAPE):
  """``Protocol.init_client`` of a private CNN: its own params and optimizer state."""
  def init_client(g, key):
    params = nets[g].init(key, api.dummy_input(image_shape))["params"]
    return api.ClientState(params, None, opt.init(params))
  return init_client


def weighted_average(uploads: list, weights: list):
  """Example-weighted mean of the uploads of all groups' clients.

  Args:
    uploads: per group, pytrees stacked [slots_g, ...] (all groups alike in shape).
    weights: per group, float32 [slots_g] train examples (0 on padding slots).

  Returns:
    sum_k n_k u_k / sum_k n_k, one pytree without the slot axis.

  >>> float(weighted_average([jnp.array([1.0, 9.0]), jnp.array([4.0])],
  ...                        [jnp.array([1.0, 1.0]), jnp.array([2.0])]))  # (1 + 9 + 8) / 4
  4.5
  """
  stacked = jax.tree.map(lambda *a: jnp.concatenate(a), *uploads)
  return cl.weighted_mean(stacked, jnp.concatenate(weights))


def count_rounds(g, key):
  """``Protocol.init_client`` of FedAvg: a client keeps only its rounds taken (int32)."""
  del g, key
  return jnp.zeros((), jnp.int32)


def local_update(rt: api.Runtime, nets, opt):
  """``Protocol.client_update`` of FedAvg (also Moss's within-type FedAvg).

  The client starts from the downloaded model w with a fresh optimizer state, runs E
  epochs of SGD on its data, counts the round, and uploads its trained model w_k.
  """
  def client_update(g, rounds_taken, w, data, idx, mask, key):
    r = cl.local_train(classifier_loss(nets[g]), opt, w, None, opt.init(w), data.x,
                       data.y, idx, mask, key, **rt.train_options())
    return rounds_taken + 1, r.params, {"loss": r.loss}
  return client_update
