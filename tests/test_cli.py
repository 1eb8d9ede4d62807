"""Command-line entry points: unknown config keys, one-line errors, quiet logs."""
import os
import subprocess
import sys

import pytest

from fedjax_het import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEDMRL = os.path.join(ROOT, "experiments", "fedmrl.py")


@pytest.mark.parametrize("key,parent", [
    ("num_clientz", "at the top level"), ("data.dataset", "of 'data'"),
    ("partition.shape", "of 'partition'"), ("runtime.devices", "of 'runtime'"),
    ("algo.gating_hidden", "of 'algo'"), ("data.name.x", "of 'data.name'")])
def test_unknown_key_at_every_level_is_named_with_the_valid_ones(key, parent):
  with pytest.raises(ValueError, match=f"unknown config key '{key}'; valid keys {parent}"):
    cli.check_argv(["main.py", f"--config={FEDMRL}:smoke", f"--config.{key}=1"])
  cli.check_argv(["main.py", f"--config={FEDMRL}:smoke", "--config.algo.d1=5",
                  "--config.data.name=cifar100", "--config", FEDMRL])


def test_overrides_are_parsed_from_argv():
  assert cli.overrides(["x", "--config=f.py:smoke", "--config.a.b=1", "--workdir=w"]) == (
      "f.py:smoke", ["a.b"])
  assert cli.overrides(["x", "--sweep", "s.py", "--sweep.seeds=0"], "sweep") == (
      "s.py", ["seeds"])


def test_main_prints_one_error_line_and_exits_2(tmp_path):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "main.py"),
                        f"--config={FEDMRL}:smoke", f"--workdir={tmp_path}",
                        "--config.data.dataset=cifar100"],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "error: unknown config key 'data.dataset'; valid keys of 'data' are ['augment', "
      "'mean', 'name', 'num_classes', 'path', 'pool', 'public', 'std', 'subsample', "
      "'subsample_per_class', 'validation']"]
  assert out.stdout == ""
  bad = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "main.py"),
                        f"--config={FEDMRL}:smoke", f"--workdir={tmp_path}",
                        "--config.partition.kind=foo"],
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines() == [
      "error: config.partition.kind='foo' is invalid: valid choices are ['iid', "
      "'pathological', 'dirichlet', 'file']"]
