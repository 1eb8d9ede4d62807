r"""Why FedProto's prototype rule falls below its clients' chance at the ledger's cut.

Reads a FedProto run's checkpoints (every step kept: a sweep with
``--keep_checkpoints=all``) and measures, at each step, for every client on its own
test split:

- the accuracy of the nearest-prototype rule over every valid global prototype (our
  default and HtFLlib's ``test_metrics``), over the client's own classes only (FedProto's
  code, ``test_inference_new_het_lt``) and of the client's own header;
- which classes the rule over every class predicts: the share of predictions outside
  the client's own classes, and the classes it predicts most;
- the distance (mean squared, over the 500 dimensions) of a test representation to its
  own class's global prototype against the nearest prototype of a class the client
  does not hold;
- the global table: each class's age (rounds since a client last sent it, replayed
  from the run's client sampling) and its scale (root mean square over dimensions)
  against each architecture's representations;
- the two terms of the local loss on the client's training data (cross-entropy and
  ``lamda`` x the prototype MSE).

  python experiments/claims/diagnose/fedproto_collapse.py \
      --workdir=<a FedProto run with checkpoints> --out=results/claims/fedproto_collapse/<name>.json

The data must be where the run read it (``FEDJAX_HET_DATA``).
"""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from fedjax_het import clients as cl  # noqa: E402
from fedjax_het import models  # noqa: E402
from fedjax_het.algorithms import base  # noqa: E402
from fedjax_het.algorithms import fedproto  # noqa: E402
from fedjax_het.algorithms.shared import init_models  # noqa: E402
from fedjax_het.training import checkpoint as ckpt_lib  # noqa: E402
from fedjax_het.training import experiment  # noqa: E402
from fedjax_het.training import program  # noqa: E402
from fedjax_het.training import runfiles  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "A FedProto run with checkpoints/.")
_OUT = flags.DEFINE_string("out", None, "Where to write the measurements (JSON).")
_ROUNDS = flags.DEFINE_list("rounds", [], "Only these checkpoint steps (default: all).")


def restore_steps(workdir: str, exp):
  """``[(round, state)]`` of every checkpoint step of ``workdir``, oldest first."""
  import orbax.checkpoint as ocp  # noqa: PLC0415

  abstract = program.compile_fns(exp).abstract
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                               max_to_keep=exp.config.keep_checkpoints,
                               fingerprint=runfiles.fingerprint(exp))
  try:
    out = []
    for step in ckpt.steps():
      if _ROUNDS.value and str(step) not in _ROUNDS.value:
        continue
      state = ckpt.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"]
      out.append((step, state))
    return out
  finally:
    ckpt.close()


def class_sent_rounds(exp, rng, rounds: int, held: np.ndarray) -> np.ndarray:
  """bool [rounds, C]: the classes some sampled client held, round by round (replayed
  from the run's sampling, a pure function of its seed and the round)."""
  rt, layout = exp.runtime, exp.runtime.layout
  out = np.zeros((rounds, layout.num_classes), bool)
  for r in range(rounds):
    sample_key, train_key = base.keys_of_round(rng, r)
    for g, ids in enumerate(layout.client_ids):
      pos, _ = base.group_draw(rt, g, sample_key, train_key)
      for p in np.asarray(pos):
        if p < len(ids):
          out[r] |= held[ids[p]]
  return out


def client_arrays(exp, net, params, idx, mask):
  """(rep float32 [n, 500], logits [n, C], labels [n]) of one client's real examples."""
  idx, mask = np.asarray(idx), np.asarray(mask)
  idx = idx[mask]
  batch = cl.make_batch(exp.data.x, exp.data.y, jnp.asarray(idx),
                        jnp.ones(len(idx), bool), **exp.runtime.batch_options())
  rep = models.extract(net, params, batch.x)
  logits = models.classify(net, params, rep)
  return (np.asarray(rep, np.float32), np.asarray(logits, np.float32),
          np.asarray(batch.y))


def measure_step(exp, state, held: np.ndarray, age: np.ndarray) -> dict:
  """The measurements of one checkpoint (see the module docstring)."""
  rt, layout = exp.runtime, exp.runtime.layout
  nets = init_models(rt, num_classes=layout.num_classes)
  table = np.asarray(state.server["table"])
  valid = np.asarray(state.server["valid"])
  lamda = float(exp.config.algo.lamda)
  per_client, preds_all = [], []
  arch_rms = {}
  for g, ids in enumerate(layout.client_ids):
    index = exp.data.groups[g]
    for pos, k in enumerate(ids):
      params = jax.tree.map(lambda a, pos=pos: a[pos], state.clients[g].unpack().params)
      rep, logits, y = client_arrays(exp, nets[g], params, index.test_idx[pos],
                                     index.test_mask[pos])
      d = np.mean(np.square(rep[:, None, :] - table[None]), -1)  # [n, C]
      protos = {"table": jnp.asarray(table), "valid": jnp.asarray(valid)}
      pred_all = np.argmax(fedproto.nearest_prototype_scores(rep, protos), -1)
      pred_own = np.argmax(fedproto.nearest_prototype_scores(
          rep, fedproto.own_classes(protos, jnp.asarray(held[k]))), -1)
      others = valid & ~held[k]
      nearest_other = np.min(np.where(others[None], d, np.inf), -1)
      own_d = d[np.arange(len(y)), y]
      tr_rep, tr_logits, tr_y = client_arrays(exp, nets[g], params, index.train_idx[pos],
                                              index.train_mask[pos])
      ce = float(np.mean(-jax.nn.log_softmax(tr_logits)[np.arange(len(tr_y)), tr_y]))
      keep = valid[tr_y]
      mse = float(np.sum(np.mean(np.square(tr_rep - table[tr_y]), -1) * keep)
                  / max(len(tr_y), 1))
      arch_rms.setdefault(layout.archs[g], []).append(float(np.sqrt(np.mean(rep ** 2))))
      preds_all.append(pred_all)
      per_client.append({
          "client": int(k), "arch": layout.archs[g],
          "held": np.flatnonzero(held[k]).tolist(),
          "acc_all": float(np.mean(pred_all == y)), "acc_own": float(np.mean(pred_own == y)),
          "acc_header": float(np.mean(np.argmax(logits, -1) == y)),
          "pred_outside_own": float(np.mean(~held[k][pred_all])),
          "d_true": float(np.mean(own_d)),
          "d_nearest_other": float(np.mean(nearest_other)) if others.any() else None,
          "other_closer": float(np.mean(nearest_other < own_d)) if others.any() else None,
          "rep_rms": float(np.sqrt(np.mean(rep ** 2))),
          "train_ce": ce, "train_lamda_mse": lamda * mse})
  preds = np.concatenate(preds_all)
  return {
      "valid": valid.tolist(),
      "class_age": age.tolist(),
      "table_rms": np.sqrt(np.mean(table ** 2, -1)).round(5).tolist(),
      "arch_rep_rms": {a: float(np.mean(v)) for a, v in arch_rms.items()},
      "predicted_share": (np.bincount(preds, minlength=layout.num_classes)
                          / len(preds)).round(4).tolist(),
      "clients": per_client,
  }


def summary_line(r: int, m: dict) -> str:
  """One line of the printed summary of step ``r``."""
  c = m["clients"]
  mean = lambda key: np.mean([x[key] for x in c if x[key] is not None])
  top = np.argsort(m["predicted_share"])[::-1][:3]
  shares = ", ".join(f"{j}: {m['predicted_share'][j]:.0%}" for j in top)
  return (f"round {r}: rule over all classes {mean('acc_all'):.2%}, over own classes "
          f"{mean('acc_own'):.2%}, header {mean('acc_header'):.2%}; predictions outside "
          f"own classes {mean('pred_outside_own'):.0%}; an other class's prototype nearer "
          f"than the true one {mean('other_closer'):.0%}; distance to true {mean('d_true'):.4f} "
          f"vs nearest other {mean('d_nearest_other'):.4f}; most predicted {shares}; class "
          f"ages {m['class_age']}; table rms {[round(v, 3) for v in m['table_rms']]}; "
          f"rep rms by arch { {a: round(v, 3) for a, v in m['arch_rep_rms'].items()} }; "
          f"train CE {mean('train_ce'):.3f}, lamda*MSE {mean('train_lamda_mse'):.4f}")


def main(argv):
  del argv
  workdir = _WORKDIR.value
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if config.algorithm != "fedproto":
    raise app.UsageError(f"{workdir} is a {config.algorithm} run, not fedproto")
  exp = experiment.prepare(config)
  with open(os.path.join(workdir, "partition.json")) as f:
    held = np.array([np.asarray(c["train_class_counts"]) > 0
                     for c in json.load(f)["clients"]])
  steps = restore_steps(workdir, exp)
  if not steps:
    raise app.UsageError(f"{workdir}/checkpoints holds no step")
  sent = class_sent_rounds(exp, steps[0][1].rng, max(r for r, _ in steps), held)
  out = {"workdir": workdir, "lamda": float(config.algo.lamda),
         "algo": config.algo.to_dict(), "steps": {}}
  for r, state in steps:
    last = [int(np.max(np.flatnonzero(sent[:r, j]), initial=-1)) for j in
            range(sent.shape[1])]
    age = np.array([r - 1 - v if v >= 0 else -1 for v in last])
    m = measure_step(exp, state, held, age)
    out["steps"][str(r)] = m
    print(summary_line(r, m), flush=True)
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
