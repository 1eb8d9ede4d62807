"""The local optimizer (torch.optim.SGD semantics) and momentum at download."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het.algorithms import base
from fedjax_het.algorithms import fedmoe
from fedjax_het.data.federated import Layout


def torch_sgd_steps(w, grads, lr, momentum, wd, clip):
  """torch: clip_grad_norm_(clip), then d = g + wd * w, b = momentum * b + d, w -= lr * b."""
  w, b = np.array(w, np.float64), None
  for g in grads:
    g = np.array(g, np.float64)
    norm = np.linalg.norm(g)
    if clip and norm > clip:
      g = g * clip / norm
    d = g + wd * w
    b = d if b is None else momentum * b + d
    w = w - lr * b
  return w


@pytest.mark.parametrize("momentum,wd,clip", [(0.0, 0.0, 0.0), (0.9, 1e-3, 0.0),
                                              (0.9, 1e-3, 1.0), (0.5, 0.1, 50.0)])
def test_sgd_follows_torch(momentum, wd, clip):
  w0 = np.array([1.0, -2.0, 0.5])
  grads = [np.array([3.0, 0.0, -4.0]), np.array([0.1, 0.2, 0.3]), np.array([-1.0, 2.0, 0.0])]
  opt = base.sgd(0.1, momentum, wd, clip)
  w, state = jnp.asarray(w0, jnp.float32), None
  state = opt.init(w)
  for g in grads:
    updates, state = opt.update(jnp.asarray(g, jnp.float32), state, w)
    w = optax.apply_updates(w, updates)
  np.testing.assert_allclose(w, torch_sgd_steps(w0, grads, 0.1, momentum, wd, clip),
                             rtol=1e-5)


def test_plain_sgd_keeps_no_buffer():
  assert not jax.tree.leaves(base.sgd(0.1).init({"w": jnp.ones(3)}))


def runtime(reset):
  return base.Runtime(Layout(("tiny",), ((0,),), (1,), 1, 10),
                      reset_downloaded_momentum=reset)


@pytest.mark.parametrize("make_opt", [lambda: base.sgd(0.1, 0.9, 1e-3, 50.0),
                                      lambda: fedmoe.optimizer(0.1, 0.2, 0.9, 1e-3, 50.0)])
def test_download_zeroes_the_momentum_of_replaced_blocks_only(make_opt):
  opt = make_opt()
  params = {"global": {"w": jnp.ones(3)}, "local": {"w": jnp.ones(2)},
            "gate": {"w": jnp.ones(2)}}
  _, state = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
  theta = {"w": jnp.full(3, 7.0)}
  new, reset_state = base.download(runtime(True), params, state, {"global": theta})
  np.testing.assert_array_equal(new["global"]["w"], theta["w"])
  np.testing.assert_array_equal(new["local"]["w"], params["local"]["w"])

  def buffers(s, block):
    return [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(s)[0]
            if any(getattr(k, "key", None) == block for k in path)]
  assert buffers(reset_state, "global") and all(
      np.all(np.asarray(b) == 0) for b in buffers(reset_state, "global"))
  for block in ("local", "gate"):
    assert all(np.all(np.asarray(b) != 0) for b in buffers(reset_state, block))
  _, kept = base.download(runtime(False), params, state, {"global": theta})
  jax.tree.map(np.testing.assert_array_equal, kept, state)
