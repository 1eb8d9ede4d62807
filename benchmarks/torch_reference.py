r"""A plain per-client PyTorch loop: the reference our compiled rounds are compared with.

One round, as a PyTorch user writes it (and as the papers' reference code runs it):
for each sampled client, in a Python loop, copy the global (shared) weights into the
client's model, run E epochs of minibatch SGD (lr 0.01, no momentum) over its examples,
and accumulate its shared part; the server then sets the shared part to the
example-weighted mean. Models and data are on the device before timing starts; on CUDA
every round ends with ``torch.cuda.synchronize()``.

Algorithms (layer widths as ``fedjax_het/models/registry.py``; 5x5 VALID convs, ReLU,
2x2 max-pool; NCHW here, NHWC in JAX -- only fc1's input rows are permuted):

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

ALGORITHMS = ("fedavg", "fedmrl", "fedmoe")
# (conv channels, hidden FC widths before the representation layer), as registry.py.
ARCHS = {"cnn1": ((16, 32), (2000,)), "cnn5": ((16, 32), (500,)),
         "tiny": ((4, 8), (32,))}  # tiny: tests only
REP_DIM = 500  # d2, the representation width of the clients' CNNs
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class Extractor(nn.Module):
  """(conv5x5-ReLU-maxpool2) per conv layer, then (Linear-ReLU) per FC layer."""

  def __init__(self, arch: str, rep_dim: int):
    super().__init__()
    convs, fcs = ARCHS[arch]
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

  def __init__(self, arch: str, rep_dim: int = REP_DIM, num_classes: int = 10):
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
    self.proj = nn.Linear(d1 + REP_DIM, REP_DIM)

  def loss(self, x, y):
    """Eq. (1)-(3) of FedMRL: CE of the small header on R[:, :d1] + CE of the large on R."""
    rep = self.proj(torch.cat([self.small.extractor(x), self.large.extractor(x)], -1))
    return (F.cross_entropy(self.small.header(rep[:, :self.d1]), y)
            + F.cross_entropy(self.large.header(rep), y))


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
    self.expert = Extractor(global_arch, REP_DIM)
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
  mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
  std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
  out = []
  for _ in range(clients):
    x = rng.integers(0, 256, (examples, 32, 32, 3), dtype=np.uint8)
    x = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255 - mean) / std
    y = torch.from_numpy(rng.integers(0, 10, examples)).long()
    out.append((x.contiguous().to(device), y.to(device)))
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
    self.num = max(1, min(clients, int(round(participation * clients))))
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


def count_params(module: nn.Module) -> int:
  return sum(p.numel() for p in module.parameters())


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--algorithm", default="fedmrl", choices=ALGORITHMS)
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--examples", type=int, default=500)
  p.add_argument("--participation", type=float, default=1.0)
  p.add_argument("--batch", type=int, default=50)
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--device", default=default_device(), choices=["cpu", "cuda"])
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  sec = time_round(args.algorithm, clients=args.clients, examples=args.examples,
                   participation=args.participation, batch=args.batch, epochs=args.epochs,
                   device=args.device, dtype=args.dtype, threads=args.threads,
                   repeats=args.repeats)
  num = max(1, min(args.clients, int(round(args.participation * args.clients))))
  print(f"torch {torch.__version__} device={args.device} algorithm={args.algorithm} "
        f"clients/round={num} examples/client={args.examples} batch={args.batch} "
        f"dtype={args.dtype}: {sec:.4f} s/round (median of {args.repeats}), "
        f"{num * args.examples * args.epochs / sec:,.0f} examples/s")


if __name__ == "__main__":
  main()
