"""How big a lowered program is, in StableHLO ops: in all and its largest computation.

What XLA's compile costs grows with the size of the computations its fusion passes see,
and faster than linearly (docs/performance.md, "Program size and compile cost"): the
GPU's ``priority-fusion`` did not finish in 7.5 minutes on a loop body of 16.5k ops. A
*computation* here is what XLA compiles as one: a function body with the functions it
calls inlined (XLA inlines calls), where each region of a control-flow op (``while``'s
condition and body, each branch of a ``case`` / ``if``) is a computation of its own.
The small regions of other ops (a ``reduce``'s or ``scatter``'s combiner, a ``sort``'s
comparator) are counted in the computation that holds the op, as XLA fuses them there.
Terminators (``return``) are not counted.

  size = hlo_size.measure(jax.jit(f).trace(*args).lower())
  size = hlo_size.measure(jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)))

The second needs no GPU: jax lowers for CUDA on any machine (``benchmarks/compile_time.py``
prints both for a run's dispatch).
"""
from __future__ import annotations

from typing import NamedTuple

CONTROL_FLOW = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if",
                          "mhlo.while", "mhlo.case", "mhlo.if"})
TERMINATORS = frozenset({"stablehlo.return", "func.return", "mhlo.return",
                         "sdy.return"})


class ProgramSize(NamedTuple):
  """Op counts of a lowered program.

  Attributes:
    total: every op of the module (each function once, however often it is called).
    largest: ops of its largest computation (calls inlined, control-flow regions apart).
    computations: how many computations (the entry, and every control-flow region).
    entry: ops of the entry computation (the program's own body, calls inlined).
  """
  total: int
  largest: int
  computations: int
  entry: int

  def __str__(self) -> str:
    return (f"{self.total} StableHLO ops, largest computation {self.largest} "
            f"({self.computations} computations)")


def _ops(region):
  for block in region.blocks:
    for op in block.operations:
      yield op.operation


def _name(op) -> str:
  return op.name


def _callee(op) -> str | None:
  if _name(op) != "func.call":
    return None
  return str(op.attributes["callee"]).lstrip("@").strip('"')


def measure(lowered) -> ProgramSize:
  """``ProgramSize`` of a ``jax.stages.Lowered`` (or of its StableHLO ``ir.Module``)."""
  module = lowered.compiler_ir("stablehlo") if hasattr(lowered, "compiler_ir") else lowered
  funcs = {}
  for op in module.body.operations:
    op = op.operation
    if _name(op) == "func.func":
      funcs[str(op.attributes["sym_name"]).strip('"')] = op
  sizes: list[int] = []  # every computation's size
  inlined: dict[str, int] = {}

  def count(region) -> int:
    n = 0
    for op in _ops(region):
      name = _name(op)
      if name in TERMINATORS:
        continue
      n += 1
      callee = _callee(op)
      if callee is not None and callee in funcs:
        n += inline(callee)
      for sub in op.regions:
        if name in CONTROL_FLOW:
          sizes.append(count(sub))
        else:
          n += count(sub)
    return n

  def inline(name: str) -> int:
    if name not in inlined:
      inlined[name] = 0  # a recursive call (none in jax's output) counts once
      inlined[name] = count(funcs[name].regions[0])
    return inlined[name]

  entry = "main" if "main" in funcs else next(iter(funcs))
  entry_size = inline(entry)
  sizes.append(entry_size)

  def every(region) -> int:
    n = 0
    for op in _ops(region):
      if _name(op) in TERMINATORS:
        continue
      n += 1 + sum(every(sub) for sub in op.regions)
    return n

  total = sum(every(f.regions[0]) for f in funcs.values())
  return ProgramSize(total, max(sizes), len(sizes), entry_size)
