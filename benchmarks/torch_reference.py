r"""A plain per-client PyTorch loop: the reference our compiled rounds are compared with.

One round, as a PyTorch user writes it (and as the papers' reference code runs it):
for each sampled client, in a Python loop, copy the global (shared) weights into the
client's model, run E epochs of minibatch SGD (lr 0.01, no momentum) over its examples,
and accumulate its shared part; the server then sets the shared part to the
example-weighted mean. Models and data are on the device before timing starts; on CUDA
every round ends with ``torch.cuda.synchronize()``.

Algorithms (layer widths read from ``fedjax_het/models/registry.py``'s ``arch_spec``;
5x5 VALID convs, ReLU, 2x2 max-pool; NCHW here, NHWC in JAX -- only fc1's input rows are
permuted):

- ``fedavg``: CNN-1 (conv16-conv32-FC2000-FC500-FC10), the whole model is shared.
- ``fedmrl``: as ``fedjax_het/algorithms/fedmrl.py``: shared small model G (CNN-5
  extractor with representation width d1=100 + header 100->10), the client's CNN-1
  (extractor 500 + header 500->10), projector Linear(d1 + 500 -> 500);
  R = P(concat(G_ex(x), F_ex(x))); loss = CE(G_hd(R[:, :d1]), y) + CE(F_hd(R), y);
  only G is shared.
- ``fedmoe``: as ``fedjax_het/algorithms/fedmoe.py``: shared global expert (CNN-5
  extractor, width 500), the client's CNN-1, gate flatten -> SwitchNorm1d(layer, batch)
  -> Linear(3072, 64) -> BN -> sigmoid -> Linear(64, 2) -> BN -> softmax;
  logits = F_hd(a_G G(x) + a_F F_ex(x)); SGD lr 0.01 for experts and header, 0.01 for
  the gate; only the global expert is shared.

Data: synthetic uint8 images of CIFAR-10's shape, normalized once and stored per client
as float32 NCHW tensors on the device (the fastest layout for this loop).

  python benchmarks/torch_reference.py --algorithm=fedmrl --clients=100 --examples=500
  python benchmarks/torch_reference.py --device=cpu --clients=10 --examples=100

``time_round(...)`` returns the median seconds per round (``benchmarks/compare.py``).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedjax_het.algorithms.shared import LOCAL_REP_DIM  # d2 = 500, the CNNs' width
from fedjax_het.clients import num_sampled
from fedjax_het.models import CIFAR_MEAN
from fedjax_het.models import CIFAR_STD
from fedjax_het.models import arch_spec

ALGORITHMS = ("fedavg", "fedmrl", "fedmoe")


class Extractor(nn.Module):
  """(conv5x5-ReLU-maxpool2) per conv layer, then (Linear-ReLU) per FC layer."""

  def __init__(self, arch: str, rep_dim: int):
    super().__init__()
    spec = arch_spec(arch)  # the library's widths: cnn1..cnn5, tiny (tests)
    convs, fcs = spec.conv_features, spec.fc_features
    chans = (3,) + convs
    self.convs = nn.ModuleList(nn.Conv2d(a, b, 5) for a, b in zip(chans, chans[1:]))
    side = 32
    for _ in convs:
      side = (side - 4) // 2
    widths = (chans[-1] * side * side,) + fcs + (rep_dim,)
    self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

  def forward(self, x):
    for conv in self.convs:
      x = F.max_pool2d(F.relu(conv(x)), 2)
    x = x.flatten(1)
    for fc in self.fcs:
      x = F.relu(fc(x))
    return x


class CNN(nn.Module):
  """Extractor + linear header (the representation is taken after the ReLU)."""

  def __init__(self, arch: str, rep_dim: int = LOCAL_REP_DIM, num_classes: int = 10):
    super().__init__()
    self.extractor = Extractor(arch, rep_dim)
    self.header = nn.Linear(rep_dim, num_classes)

  def forward(self, x):
    return self.header(self.extractor(x))


class MRLClient(nn.Module):
  """A FedMRL client: shared small model, private CNN-1, private projector."""

  def __init__(self, arch: str = "cnn1", small_arch: str = "cnn5", d1: int = 100):
    super().__init__()
    self.d1 = d1
    self.small = CNN(small_arch, rep_dim=d1)
    self.large = CNN(arch)
    self.proj = nn.Linear(d1 + LOCAL_REP_DIM, LOCAL_REP_DIM)

  def heads(self, x):
    """Eq. (1)-(2): (small header on R[:, :d1], large header on R) of the fused R."""
    rep = self.proj(torch.cat([self.small.extractor(x), self.large.extractor(x)], -1))
    return self.small.header(rep[:, :self.d1]), self.large.header(rep)

  def loss(self, x, y):
    """Eq. (3) of FedMRL: CE of the small header + CE of the large header."""
    small, large = self.heads(x)
    return F.cross_entropy(small, y) + F.cross_entropy(large, y)

  def predict(self, x):
    """Logits of the ``mix-large`` inference (the library's default)."""
    return self.heads(x)[1]


class SwitchNorm1d(nn.Module):
  """Switchable normalization over {layer, batch} statistics (as fedjax_het's gating.py).

  Biased variances, running statistics with momentum 0.997, running variance from 1.
  """

  def __init__(self, dim: int, momentum: float = 0.997, eps: float = 1e-5):
    super().__init__()
    self.momentum, self.eps = momentum, eps
    self.weight = nn.Parameter(torch.ones(dim))
    self.bias = nn.Parameter(torch.zeros(dim))
    self.mean_weight = nn.Parameter(torch.ones(2))
    self.var_weight = nn.Parameter(torch.ones(2))
    self.register_buffer("running_mean", torch.zeros(dim))
    self.register_buffer("running_var", torch.ones(dim))

  def forward(self, x):
    mean_ln = x.mean(-1, keepdim=True)
    var_ln = x.var(-1, keepdim=True, unbiased=False)
    if self.training:
      mean_bn, var_bn = x.mean(0), x.var(0, unbiased=False)
      with torch.no_grad():
        m = self.momentum
        self.running_mean.mul_(m).add_((1 - m) * mean_bn)
        self.running_var.mul_(m).add_((1 - m) * var_bn)
    else:
      mean_bn, var_bn = self.running_mean, self.running_var
    mw, vw = self.mean_weight.softmax(0), self.var_weight.softmax(0)
    mean = mw[0] * mean_ln + mw[1] * mean_bn
    var = vw[0] * var_ln + vw[1] * var_bn
    return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class Gate(nn.Module):
  """pFedMoE's gating network: images -> [alpha_global, alpha_local]."""

  def __init__(self, dim: int = 3 * 32 * 32, hidden: int = 64):
    super().__init__()
    self.norm = SwitchNorm1d(dim)
    self.fc1, self.bn1 = nn.Linear(dim, hidden), nn.BatchNorm1d(hidden)
    self.fc2, self.bn2 = nn.Linear(hidden, 2), nn.BatchNorm1d(2)

  def forward(self, x):
    h = torch.sigmoid(self.bn1(self.fc1(self.norm(x.flatten(1)))))
    return torch.softmax(self.bn2(self.fc2(h)), -1)


class MoEClient(nn.Module):
  """A FedMoE client: shared global expert, private CNN-1 and gate."""

  def __init__(self, arch: str = "cnn1", global_arch: str = "cnn5", hidden: int = 64):
    super().__init__()
    self.expert = Extractor(global_arch, LOCAL_REP_DIM)
    self.local = CNN(arch)
    self.gate = Gate(hidden=hidden)

  def loss(self, x, y):
    w = self.gate(x)
    mixed = w[:, :1] * self.expert(x) + w[:, 1:] * self.local.extractor(x)
    return F.cross_entropy(self.local.header(mixed), y)


class ClassifierClient(nn.Module):
  """A FedAvg client: the whole CNN is shared."""

  def __init__(self, arch: str = "cnn1"):
    super().__init__()
    self.model = CNN(arch)

  def loss(self, x, y):
    return F.cross_entropy(self.model(x), y)

  def predict(self, x):
    return self.model(x)


def shared_module(client: nn.Module) -> nn.Module:
  """The part of a client that the server averages."""
  if isinstance(client, MRLClient):
    return client.small
  if isinstance(client, MoEClient):
    return client.expert
  return client.model


def param_groups(client: nn.Module, lr: float, gate_lr: float) -> list:
  """SGD parameter groups: the gate (FedMoE) has its own learning rate."""
  if isinstance(client, MoEClient):
    gate = set(id(p) for p in client.gate.parameters())
    rest = [p for p in client.parameters() if id(p) not in gate]
    return [{"params": rest, "lr": lr}, {"params": list(client.gate.parameters()), "lr": gate_lr}]
  return [{"params": list(client.parameters()), "lr": lr}]


def make_client(algorithm: str, arch: str = "cnn1") -> nn.Module:
  """A fresh client of ``algorithm`` whose own model is ``arch``."""
  if algorithm not in ALGORITHMS:
    raise ValueError(f"algorithm={algorithm!r}; valid: {ALGORITHMS}")
  return {"fedavg": ClassifierClient, "fedmrl": MRLClient, "fedmoe": MoEClient}[algorithm](arch)


def synthetic_clients(clients: int, examples: int, device, seed: int = 0):
  """Per-client (x float32 [n, 3, 32, 32] normalized, y int64 [n]) tensors on ``device``."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(clients):
    x = rng.integers(0, 256, (examples, 32, 32, 3), dtype=np.uint8)
    out.append(to_tensors(x, rng.integers(0, 10, examples), device))
  return out


def local_train(client: nn.Module, x, y, *, epochs: int, batch: int, lr: float,
                gate_lr: float, autocast) -> None:
  """E epochs of minibatch SGD over one client's examples, shuffled every epoch."""
  opt = torch.optim.SGD(param_groups(client, lr, gate_lr), lr=lr, momentum=0.0)
  client.train()
  n = x.shape[0]
  for _ in range(epochs):
    perm = torch.randperm(n, device=x.device)
    for start in range(0, n, batch):
      idx = perm[start:start + batch]
      with autocast():
        loss = client.loss(x[idx], y[idx])
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()


class Federation:
  """Global shared weights, every client's module, their data; ``round()`` runs one."""

  def __init__(self, algorithm: str, *, clients: int, examples: int, participation: float,
               batch: int = 50, epochs: int = 1, lr: float = 0.01, gate_lr: float = 0.01,
               device=None, dtype: str = "float32", arch: str = "cnn1", seed: int = 0):
    self.device = torch.device(device or default_device())
    torch.manual_seed(seed)
    self.algorithm, self.epochs, self.batch = algorithm, epochs, batch
    self.lr, self.gate_lr = lr, gate_lr
    self.num = num_sampled(clients, participation)
    self.rng = np.random.default_rng(seed)
    self.data = synthetic_clients(clients, examples, self.device, seed)
    if algorithm == "fedavg":  # one working model: every client starts from the global
      self.work = make_client(algorithm, arch).to(self.device)
      self.clients = None
    else:  # private parts persist between rounds
      self.clients = [make_client(algorithm, arch).to(self.device) for _ in range(clients)]
    template = self.work if self.clients is None else self.clients[0]
    self.global_state = copy.deepcopy(shared_module(template).state_dict())
    self.dtype = dtype

  def autocast(self):
    """bf16 autocast when asked for (float32 otherwise)."""
    return torch.autocast(self.device.type, dtype=torch.bfloat16,
                          enabled=self.dtype == "bfloat16")

  def round(self) -> None:
    """One communication round."""
    sampled = self.rng.choice(len(self.data), self.num, replace=False)
    sums = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in self.global_state.items()
            if v.is_floating_point()}
    total = 0
    for k in sampled:
      client = self.work if self.clients is None else self.clients[k]
      shared = shared_module(client)
      shared.load_state_dict(self.global_state)  # download: copies the global weights
      x, y = self.data[k]
      local_train(client, x, y, epochs=self.epochs, batch=self.batch, lr=self.lr,
                  gate_lr=self.gate_lr, autocast=self.autocast)
      with torch.no_grad():
        for name, v in shared.state_dict().items():
          if name in sums:
            sums[name].add_(v.float(), alpha=float(x.shape[0]))
      total += x.shape[0]
    with torch.no_grad():
      for name, s in sums.items():
        self.global_state[name].copy_(s / total)

  def sync(self) -> None:
    if self.device.type == "cuda":
      torch.cuda.synchronize(self.device)


def default_device() -> str:
  return "cuda" if torch.cuda.is_available() else "cpu"


def time_round(algorithm: str, *, clients: int, examples: int, participation: float = 1.0,
               batch: int = 50, epochs: int = 1, device=None, dtype: str = "float32",
               arch: str = "cnn1", threads: int = 0, repeats: int = 5, warmup: int = 1,
               seed: int = 0) -> float:
  """Median wall seconds of one round after ``warmup`` rounds.

  Args:
    algorithm: one of ``ALGORITHMS``.
    clients, examples, participation: N, examples per client, C.
    batch, epochs: B, E.
    device: 'cpu', 'cuda' or None (cuda when available).
    dtype: 'float32' or 'bfloat16' (autocast).
    arch: the clients' own CNN ('cnn1'; 'tiny' in tests).
    threads: CPU intra-op threads for the measurement (0: torch's default). On a shared
      2-core machine the default 2 OpenMP threads ran 10x slower than 1.
    repeats: timed rounds.
    warmup: untimed rounds first (cuDNN autotuning, allocator warm-up).
    seed: data, init and sampling seed.

  Returns:
    Median seconds per round.
  """
  default_threads = torch.get_num_threads()
  if threads:
    torch.set_num_threads(threads)
  try:
    fed = Federation(algorithm, clients=clients, examples=examples,
                     participation=participation, batch=batch, epochs=epochs,
                     device=device, dtype=dtype, arch=arch, seed=seed)
    for _ in range(warmup):
      fed.round()
    fed.sync()
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      fed.round()
      fed.sync()
      times.append(time.perf_counter() - t)
  finally:
    torch.set_num_threads(default_threads)
  return statistics.median(times)


# ---------------------------------------------------------------- a given federation


PROTOCOL_ALGORITHMS = ("fedmrl", "standalone")


def to_tensors(x: np.ndarray, y: np.ndarray, device) -> tuple:
  """uint8 NHWC images and labels -> (x float32 NCHW normalized, y int64) on ``device``."""
  mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
  std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
  xt = (torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).float() / 255
        - mean) / std
  return xt.contiguous().to(device), torch.from_numpy(np.asarray(y)).long().to(device)


class ProtocolFederation:
  """Given clients (own architecture, train and test examples) trained as the papers' code.

  Every round all clients train in turn (C = 100%): download the shared part (FedMRL's
  small model G, momentum buffers of G zeroed as the library's
  ``reset_downloaded_momentum``), E epochs of shuffled minibatches of B (the last one
  partial) with ``torch.optim.SGD(lr, momentum, weight_decay)`` after
  ``clip_grad_norm_(grad_clip)`` (0: none), one optimizer per client kept between rounds;
  then, with ``evaluate``, each client's test accuracy right after its training (the
  library's ``sampled_test_acc``), the example-weighted average of G, and (FedMRL) every
  client's test accuracy with the new G (``mean_test_acc``; for Standalone the first
  evaluation already is that one). Evaluation batches have ``eval_batch`` examples.

  Args:
    algorithm: one of ``PROTOCOL_ALGORITHMS``.
    clients: per client ``(arch, x_train, y_train, x_test, y_test)``, images uint8
      [n, 32, 32, 3] (NHWC, as the library's pool), labels int.
    d1, small_arch: FedMRL's shared small model.
  """

  def __init__(self, algorithm: str, clients: list, *, batch: int = 64, epochs: int = 1,
               lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
               grad_clip: float = 0.0, evaluate: bool = True, eval_batch: int = 0,
               d1: int = 100, small_arch: str = "cnn5", device=None, seed: int = 0):
    if algorithm not in PROTOCOL_ALGORITHMS:
      raise ValueError(f"algorithm={algorithm!r}; valid: {PROTOCOL_ALGORITHMS}")
    self.device = torch.device(device or default_device())
    torch.manual_seed(seed)
    self.algorithm, self.batch, self.epochs = algorithm, batch, epochs
    self.grad_clip, self.evaluate = grad_clip, evaluate
    self.eval_batch = eval_batch or batch
    self.models, self.opts, self.data = [], [], []
    for arch, xtr, ytr, xte, yte in clients:
      model = (MRLClient(arch, small_arch, d1) if algorithm == "fedmrl"
               else ClassifierClient(arch))
      model = model.to(self.device)
      self.models.append(model)
      self.opts.append(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                       weight_decay=weight_decay))
      self.data.append(to_tensors(xtr, ytr, self.device) + to_tensors(xte, yte, self.device))
    self.global_state = (copy.deepcopy(self.models[0].small.state_dict())
                         if algorithm == "fedmrl" else None)
    self.sampled_acc = self.mean_acc = float("nan")

  def download(self, k: int) -> None:
    """FedMRL: the global G into client k, and a fresh momentum buffer for it."""
    small = self.models[k].small
    small.load_state_dict(self.global_state)
    state = self.opts[k].state
    for p in small.parameters():
      state.pop(p, None)

  def train(self, k: int) -> None:
    model, opt = self.models[k], self.opts[k]
    x, y = self.data[k][:2]
    model.train()
    n = x.shape[0]
    for _ in range(self.epochs):
      perm = torch.randperm(n, device=x.device)
      for start in range(0, n, self.batch):
        idx = perm[start:start + self.batch]
        loss = model.loss(x[idx], y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
          nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        opt.step()

  @torch.no_grad()
  def accuracy(self, k: int) -> float:
    model = self.models[k]
    x, y = self.data[k][2:]
    model.eval()
    correct = 0
    for start in range(0, x.shape[0], self.eval_batch):
      pred = model.predict(x[start:start + self.eval_batch]).argmax(-1)
      correct += int((pred == y[start:start + self.eval_batch]).sum())
    return correct / max(x.shape[0], 1)

  def round(self) -> None:
    """One communication round (every client trains)."""
    accs, uploads, weights = [], [], []
    for k in range(len(self.models)):
      if self.algorithm == "fedmrl":
        self.download(k)
      self.train(k)
      if self.evaluate:
        accs.append(self.accuracy(k))
      if self.algorithm == "fedmrl":
        uploads.append({n: v.detach().clone()
                        for n, v in self.models[k].small.state_dict().items()})
        weights.append(float(self.data[k][0].shape[0]))
    if accs:
      self.sampled_acc = self.mean_acc = float(np.mean(accs))
    if self.algorithm == "fedmrl":
      total = sum(weights)
      with torch.no_grad():
        for name, v in self.global_state.items():
          v.copy_(sum(w * u[name] for w, u in zip(weights, uploads)) / total)
      if self.evaluate:  # every client with the new G, as the library's evaluate
        for k in range(len(self.models)):
          self.models[k].small.load_state_dict(self.global_state)
        self.mean_acc = float(np.mean([self.accuracy(k) for k in range(len(self.models))]))

  def sync(self) -> None:
    if self.device.type == "cuda":
      torch.cuda.synchronize(self.device)


def time_protocol(algorithm: str, clients: list, *, rounds: int = 3, warmup: int = 1,
                  threads: int = 0, **kwargs) -> tuple[list[float], list[float], float]:
  """Wall and CPU seconds of each of ``rounds`` rounds of a ``ProtocolFederation``.

  Args:
    algorithm, clients, kwargs: ``ProtocolFederation``'s.
    rounds: timed rounds, after ``warmup`` untimed ones.
    threads: CPU intra-op threads (0: torch's default).

  Returns:
    (wall seconds per round, process CPU seconds per round, last mean test accuracy).
  """
  default_threads = torch.get_num_threads()
  if threads:
    torch.set_num_threads(threads)
  try:
    fed = ProtocolFederation(algorithm, clients, **kwargs)
    for _ in range(warmup):
      fed.round()
    fed.sync()
    walls, cpus = [], []
    for _ in range(rounds):
      t, c = time.perf_counter(), time.process_time()
      fed.round()
      fed.sync()
      walls.append(time.perf_counter() - t)
      cpus.append(time.process_time() - c)
  finally:
    torch.set_num_threads(default_threads)
  return walls, cpus, fed.mean_acc


def count_params(module: nn.Module) -> int:
  return sum(p.numel() for p in module.parameters())


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--algorithm", default="fedmrl", choices=ALGORITHMS,
                 help="the algorithm whose round is timed")
  p.add_argument("--clients", type=int, default=100, help="clients N")
  p.add_argument("--examples", type=int, default=500,
                 help="training examples per client")
  p.add_argument("--participation", type=float, default=1.0,
                 help="fraction C of the clients trained per round")
  p.add_argument("--batch", type=int, default=50, help="batch size B")
  p.add_argument("--epochs", type=int, default=1, help="local epochs E")
  p.add_argument("--device", default=default_device(), choices=["cpu", "cuda"],
                 help="torch device (the default: cuda when available)")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="bfloat16: torch autocast")
  p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed rounds (the median is reported)")
  args = p.parse_args()
  sec = time_round(args.algorithm, clients=args.clients, examples=args.examples,
                   participation=args.participation, batch=args.batch, epochs=args.epochs,
                   device=args.device, dtype=args.dtype, threads=args.threads,
                   repeats=args.repeats)
  num = num_sampled(args.clients, args.participation)
  print(f"torch {torch.__version__} device={args.device} algorithm={args.algorithm} "
        f"clients/round={num} examples/client={args.examples} batch={args.batch} "
        f"dtype={args.dtype}: {sec:.4f} s/round (median of {args.repeats}), "
        f"{num * args.examples * args.epochs / sec:,.0f} examples/s")


if __name__ == "__main__":
  main()
