"""The package's layout: no algorithm module imports another (read from the source)."""
import ast
import os

import pytest

from fedjax_het import algorithms

PACKAGE = "fedjax_het.algorithms"
ALGORITHM_DIR = os.path.dirname(os.path.abspath(algorithms.__file__))
# what algorithms are built from; none of these imports an algorithm module either
LIBRARIES = {"api", "rounds", "base", "shared", "class_tables", "mutual"}
OWN_SUBMODULES = {"moss": {"moss_wire"}}  # Moss's WIRE, written for it alone
ALGORITHMS = sorted(spec.build.__module__.rsplit(".", 1)[-1]
                    for spec in algorithms.SPECS.values())


def algorithm_imports(module: str) -> set[str]:
  """The ``fedjax_het.algorithms`` modules a module of the package imports (any depth)."""
  with open(os.path.join(ALGORITHM_DIR, module + ".py")) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found |= {a.name[len(PACKAGE) + 1:].split(".")[0] for a in node.names
                if a.name.startswith(PACKAGE + ".")}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == PACKAGE:
        found |= {a.name for a in node.names}
      elif node.module.startswith(PACKAGE + "."):
        found.add(node.module[len(PACKAGE) + 1:].split(".")[0])
    elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from . import x
      found |= ({node.module.split(".")[0]} if node.module else
                {a.name for a in node.names})
  return found


def test_every_builtin_algorithm_is_checked():
  assert set(ALGORITHMS) == {"fd", "fedapen", "fedavg", "fedkd", "fedmoe", "fedmrl",
                             "fedproto", "fml", "lg_fedavg", "moss", "standalone"}


@pytest.mark.parametrize("module", ALGORITHMS)
def test_no_algorithm_module_imports_another(module):
  allowed = LIBRARIES | OWN_SUBMODULES.get(module, set())
  imported = algorithm_imports(module)
  assert imported <= allowed, (
      f"fedjax_het/algorithms/{module}.py imports {sorted(imported - allowed)}; what "
      f"algorithms share belongs in one of {sorted(LIBRARIES)}")


@pytest.mark.parametrize("module", sorted(LIBRARIES | {"moss_wire"}))
def test_shared_modules_import_no_algorithm(module):
  assert not algorithm_imports(module) & set(ALGORITHMS)


def test_the_parser_sees_each_import_form():
  """``algorithm_imports`` on this repository's own modules: fedapen's FML pieces come
  from ``mutual``, moss's WIRE through ``import ... as``."""
  assert "mutual" in algorithm_imports("fedapen")
  assert "moss_wire" in algorithm_imports("moss")
  assert {"fedavg", "moss", "api"} <= algorithm_imports("__init__")
