"""The contract of an algorithm (``algorithms.api``): each fact about it written once."""
import inspect

import pytest

from fedjax_het import algorithms
from fedjax_het.algorithms import api
from fedjax_het.deploy import robust

# every built-in's defaults as its SPEC said them before they were read from the
# factory (a default that moves is a change of the runs, not of the code)
DEFAULTS = {
    "standalone": {}, "fedavg": {}, "lg_fedavg": {},
    "fd": dict(lamda=1.0, distill="ce"),
    "fedproto": dict(lamda=1.0, inference="prototype", prototype_memory=True,
                     prototype_classes="all", prototype_weighting="counts",
                     prototypes_from="after_training"),
    "fml": dict(alpha=0.5, beta=0.5, small_arch="cnn5", rep_dim=500, evaluate="private",
                kl_reduction="batchmean"),
    "fedkd": dict(small_arch="cnn5", rep_dim=500, svd_energy_start=0.95,
                  svd_energy_end=0.98, evaluate="private", kl_reduction="batchmean"),
    "fedapen": dict(small_arch="cnn5", rep_dim=500, holdout_fraction=0.1, lambda_steps=1,
                    lambda_learning_rate=1e-3),
    "fedmrl": dict(d1=100, small_arch="cnn5", m_lc=1.0, m_hf=1.0, use_mrl=True,
                   inference="mix-large", aggregation="paper"),
    "fedmoe": dict(gating_learning_rate=0.01, gating_hidden=64, global_arch="cnn5"),
    "moss": dict(proxy_arch="auto", aggregation="file", mapping="wire", public_size=500,
                 public_batch=50, wire_steps=10, wire_lr=0.01, meta_lr=1e-3, beta=0.5,
                 wire_layers="conv1,conv2,rep", public_domain="held_out", wire_clip=0.0),
}
# keys a build passes from the config's top level, not from ``config.algo``
FROM_CONFIG = {"learning_rate", "momentum", "weight_decay", "grad_clip", "num_rounds"}


def factory_defaults(factory) -> dict:
  return {n: p.default for n, p in inspect.signature(factory).parameters.items()
          if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in FROM_CONFIG}


@pytest.mark.parametrize("name", sorted(algorithms.SPECS))
def test_every_spec_says_its_factorys_defaults(name):
  module = getattr(algorithms, name)
  spec, factory = algorithms.SPECS[name], getattr(module, name)
  assert spec.hparams == factory_defaults(factory) == DEFAULTS[name]
  assert list(spec.hparams) == list(DEFAULTS[name])  # the order configs list them in
  for key, values in spec.choices.items():
    assert spec.hparams[key] in values, (name, key)


def test_a_plug_in_spec_says_its_factorys_defaults():
  from examples import fedprox
  assert fedprox.SPEC.hparams == factory_defaults(fedprox.fedprox) == dict(
      mu=0.01, aggregation="weighted")


def test_hparams_of_reads_keyword_defaults_without_the_shared_keys():
  def algo(rt, positional=1, *, learning_rate, momentum=0.9, mu=0.5, rule="w",
           num_rounds=3, required):
    del rt, positional, learning_rate, momentum, mu, rule, num_rounds, required
  assert api.hparams_of(algo) == {"mu": 0.5, "rule": "w", "num_rounds": 3}
  assert api.hparams_of(algo, exclude=("num_rounds",)) == {"mu": 0.5, "rule": "w"}


def test_the_spec_says_whether_the_algorithm_averages():
  averaging = {n for n, s in algorithms.SPECS.items() if s.averages}
  assert averaging == {"fedavg", "fedmrl", "fedmoe", "lg_fedavg", "fml", "fedapen"}
  # the deployment reads the Spec (``algorithms.averages``)
  assert robust.averaging_algorithms() == sorted(averaging)
  robust.check_rule("median", "examples.fedprox:SPEC")
  with pytest.raises(ValueError, match="'fd' takes only 'mean'"):
    robust.check_rule("median", "fd")
  assert all(algorithms.averages(n) == (n in averaging) for n in algorithms.SPECS)
  # a plug-in algorithm by reference: FedProx averages, as FedAvg does
  assert algorithms.averages("examples.fedprox:SPEC")
  algorithms.register_algorithm("plain_table", algorithms.SPECS["fd"])
  try:
    assert not algorithms.averages("plain_table")
  finally:
    del algorithms.REGISTERED["plain_table"]
  with pytest.raises(ValueError, match="config.algorithm='nope'"):
    algorithms.averages("nope")
