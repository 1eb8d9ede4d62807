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

After XLA's passes, the optimized program is a set of *kernels* (``kernels``): each fused
computation is one, and XLA:CPU generates code (through MLIR and LLVM) once per distinct
body. On the 2-core CPU a dispatch's compile grew with its fused computations, about
4 ms each, far more than with the distinct ones (docs/performance.md, "Program size and
compile cost").

  census = hlo_size.kernels(jax.jit(f).trace(*args).lower().compile())
"""
from __future__ import annotations

import re
from typing import NamedTuple

CONTROL_FLOW = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if",
                          "mhlo.while", "mhlo.case", "mhlo.if"})
TERMINATORS = frozenset({"stablehlo.return", "func.return", "mhlo.return",
                         "sdy.return"})


class ProgramSize(NamedTuple):
  """Op counts of a lowered program.

  Attributes:
    total: ops XLA compiles once calls are inlined: the sum over computations.
    largest: ops of the largest computation (calls inlined, control-flow regions apart).
    computations: how many computations (the entry, and every control-flow region).
    entry: ops of the entry computation (the program's own body, calls inlined).
    module: ops of the module as written, each function once however often it is called.
    largest_uncalled: the largest computation when calls are not inlined (every function
      body and every control-flow region a computation of its own, a call one op), the
      way one reads the module's text.
  """
  total: int
  largest: int
  computations: int
  entry: int
  module: int
  largest_uncalled: int

  def __str__(self) -> str:
    return (f"{self.total} StableHLO ops, largest computation {self.largest} "
            f"({self.computations} computations; as written {self.module} ops, "
            f"largest {self.largest_uncalled})")


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

  def count(region, sizes: list, inline) -> int:
    """Ops of ``region``, each control-flow region apart (appended to ``sizes``);
    ``inline(callee)``: what a call adds besides its own op."""
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
          sizes.append(count(sub, sizes, inline))
        else:
          n += count(sub, sizes, inline)
    return n

  # calls inlined: every call site counts its callee's body (and its regions) again
  inlined: list[int] = []

  def inline(callee: str) -> int:
    return count(funcs[callee].regions[0], inlined, inline)
  entry = "main" if "main" in funcs else next(iter(funcs))
  entry_size = inline(entry)
  inlined.append(entry_size)
  # as written: each function once, a computation of its own
  written: list[int] = []
  for f in funcs.values():
    written.append(count(f.regions[0], written, lambda _: 0))
  return ProgramSize(sum(inlined), max(inlined), len(inlined), entry_size, sum(written),
                     max(written))


class KernelCount(NamedTuple):
  """The fused computations of a compiled program.

  Attributes:
    fusions: fused computations in the optimized HLO module (one per fusion op).
    distinct: how many different bodies they have (names and metadata ignored): the
      kernels a backend that shares identical fusions generates code for.
  """
  fusions: int
  distinct: int

  def __str__(self) -> str:
    return f"{self.fusions} fused computations, {self.distinct} distinct kernels"


# an HLO value's or computation's name (``%fused_computation.12``, ``param_0.3``)
_HLO_NAME = re.compile(r"%[\w.\-]+")
_METADATA = re.compile(r", metadata=\{[^}]*\}")


def _computations(text: str):
  """``(header, body lines)`` of each computation of an HLO module's text."""
  header, body = None, []
  for line in text.splitlines():
    stripped = line.strip()
    if header is None:
      if stripped.endswith("{") and "(" in stripped and not stripped.startswith("HloModule"):
        header, body = stripped, []
    elif stripped == "}":
      yield header, body
      header = None
    else:
      body.append(stripped)


def kernels(compiled_or_text) -> KernelCount:
  """``KernelCount`` of a compiled program (``jax.stages.Compiled``) or of its HLO text.

  A fused computation is one whose name starts with ``fused`` or that a ``fusion`` op
  calls (``calls=``); two count as one kernel when their bodies agree once value names
  and metadata are set aside (shapes, constants and slice bounds do count).
  """
  bodies = kernel_bodies(compiled_or_text)
  return KernelCount(len(bodies), len(set(bodies)))


# what a kernel is named after: the first of these ops its body holds (else "elementwise")
KERNEL_KINDS = ("convolution", "dot", "select-and-scatter", "reduce-window", "scatter",
                "gather", "sort", "reduce", "dynamic-update-slice", "dynamic-slice",
                "concatenate", "slice", "pad", "transpose")
_OPCODE = re.compile(r"\s([a-z][a-z\-]*)\(")


def kernel_kinds(compiled_or_text) -> dict[str, int]:
  """The distinct kernels of ``kernels`` by kind, most first: a kernel is named after the
  first op of ``KERNEL_KINDS`` its body holds, ``elementwise`` where it holds none."""
  counts: dict[str, int] = {}
  for body in set(kernel_bodies(compiled_or_text)):
    ops = set(_OPCODE.findall(body))
    kind = next((k for k in KERNEL_KINDS if k in ops), "elementwise")
    counts[kind] = counts.get(kind, 0) + 1
  return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def kernel_bodies(compiled_or_text) -> list[str]:
  """Each fused computation's body as text, value names and metadata set aside: equal
  texts are one kernel (``kernels``)."""
  text = (compiled_or_text if isinstance(compiled_or_text, str)
          else compiled_or_text.as_text())
  called = set(re.findall(r" fusion\(.*?calls=(%?[\w.\-]+)", text))
  called = {name.lstrip("%") for name in called}
  bodies = []
  for header, body in _computations(text):
    name = header.split()[0].lstrip("%")
    if header.startswith("ENTRY"):
      continue
    if not (name.startswith("fused") or name in called):
      continue
    bodies.append("\n".join(_METADATA.sub("", _HLO_NAME.sub("%", line)) for line in body))
  return bodies
