"""Building an experiment: a config -> validated, data read and placed, algorithm built.

``prepare(config)`` does all validation and data reading before anything is compiled or
written (an ``Experiment``; the checks are ``fedjax_het.validation``'s);
``make_runtime`` and ``place_data`` are its steps, shared with the deployment (``fedjax_het.deploy``), and ``describe`` is the
one line a run logs about what it will run.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import config as config_lib
from fedjax_het import data as data_lib
from fedjax_het import models
from fedjax_het import sharding
from fedjax_het import validation
from fedjax_het.algorithms import Algorithm
from fedjax_het.algorithms import Runtime
from fedjax_het.algorithms import get_spec
from fedjax_het.clients import is_debug
from fedjax_het.data import partition_file
from fedjax_het.data.pool import load_clients


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything a run needs, built from a config before any compute.

  Attributes:
    config: the resolved config (algorithm defaults filled in).
    runtime: static client-side settings (layout, devices, ...).
    algorithm: the algorithm's pure functions.
    data: ``FederatedData`` placed on the devices.
    class_counts: int [num_clients, 2, num_classes], train and test class counts.
    client_archs: architecture name of each client.
    data_source: {'source', 'fingerprint', 'examples', 'image_shape', 'num_classes',
      'normalization'}: where the data was read, a hash of the dataset, the pool size,
      the images' shape, the classes and the per-channel (mean, std) used (recorded in
      ``summary.json``).
    tables: every client's train and test indices into the pool
      (``partition_file.ClientTables``; a run writes them to ``partition_indices.npz``).
  """
  config: ml_collections.ConfigDict
  runtime: Runtime
  algorithm: Algorithm
  data: data_lib.FederatedData
  class_counts: np.ndarray
  client_archs: tuple
  data_source: dict = dataclasses.field(default_factory=dict)
  tables: partition_file.ClientTables | None = None


def place_data(fed: data_lib.FederatedData, mesh) -> data_lib.FederatedData:
  """Pooled arrays replicated, client index tables sharded over the client axis."""
  return fed.replace(x=sharding.place_replicated(jnp.asarray(fed.x), mesh),
                     y=sharding.place_replicated(jnp.asarray(fed.y), mesh),
                     groups=sharding.place_clients(fed.groups, mesh))


def make_runtime(config, layout, mesh, normalization=None) -> Runtime:
  """The ``Runtime`` of a config (``mesh=None``: one device, as a deployment's processes).

  ``normalization``: the dataset's ``(mean, std)`` (``Pool.normalization``).
  """
  return Runtime(layout=layout, participation=config.participation,
                 local_epochs=config.local_epochs, batch_size=config.batch_size,
                 client_parallelism=config.runtime.client_parallelism,
                 num_shards=mesh.size if mesh is not None else 1, mesh=mesh,
                 compute_dtype=jnp.dtype(config.runtime.compute_dtype),
                 augment=config.data.augment, drop_last=config.drop_last,
                 reset_downloaded_momentum=config.reset_downloaded_momentum,
                 eval_sampled=config.eval_sampled, normalization=normalization)


def prepare(config: ml_collections.ConfigDict,
            build: Callable[[Any, Runtime], Algorithm] | None = None, *,
            place: bool = True, devices: list | None = None) -> Experiment:
  """Validates the config, loads and partitions the data, builds the algorithm.

  Args:
    config: experiment config (see ``fedjax_het.config.base_config``).
    build: optional ``(config, runtime) -> Algorithm`` overriding the config's algorithm
      (``algorithms.get_spec``), for research code plugging in its own algorithm.
    place: put the data on the devices (False keeps numpy arrays: ``run_seeds`` stacks
      the data of several seeds first).
    devices: the devices the run's mesh takes (``sharding.client_mesh``; default jax's):
      a deviceless compile's (``training.deviceless``).
  """
  validation.validate(config)
  config = validation.with_algo_defaults(config)
  archs = tuple(models.client_archs(config.models, config.num_clients))
  pool, train, test, counts = load_clients(**config_lib.data_args(config))
  validation.check_models(config, archs, pool)
  mesh = sharding.client_mesh(config.runtime.num_devices, devices)
  fed, layout = data_lib.build_federated_data(
      pool.x, pool.y, train, test, archs, num_classes=pool.num_classes,
      pad_clients_to=mesh.size, pad_examples_to=config.batch_size)
  rt = make_runtime(config, layout, mesh, pool.normalization)
  algorithm = (build or get_spec(config.algorithm).build)(config, rt)
  return Experiment(config, rt, algorithm, place_data(fed, mesh) if place else fed, counts,
                    archs, pool.summary(), pool.tables(train, test))


def describe(exp: Experiment, start: int) -> str:
  """One line on what will run: algorithm, data, clients, architectures, devices, rounds."""
  c = exp.config
  archs = ", ".join(f"{a} x{n}" for a, n in zip(exp.runtime.layout.archs,
                                               exp.runtime.layout.group_sizes))
  k = sum(exp.runtime.expected_sampled(g) for g in range(exp.runtime.layout.num_groups))
  devices = f"{exp.runtime.num_shards} {jax.default_backend()} device" + (
      "s" if exp.runtime.num_shards > 1 else "")
  mode = exp.runtime.client_parallelism
  if is_debug(mode):  # a run many times slower than the compiled one says so first
    devices += (f", {mode}: clients one by one, each "
                f"{'jitted on its own' if mode == 'debug' else 'op by op'}")
  src = exp.data_source
  shape = ("" if c.data.name in data_lib.DATASETS else " of " + "x".join(
      map(str, exp.runtime.layout.image_shape)) + f", {exp.runtime.layout.num_classes} "
      "classes")
  return (f"{c.algorithm} | {c.data.name} ({len(exp.data.y)} examples{shape}, pool "
          f"{c.data.pool}; {src.get('source', '?')}, fingerprint "
          f"{src.get('fingerprint', '?')}) | {c.num_clients} clients ({archs}), "
          f"{k:g} per round | "
          f"{devices} | rounds {start + 1}..{c.num_rounds}, E={c.local_epochs}, "
          f"B={c.batch_size}")
