"""Command-line entry points: one-line errors with exit status 2, --help, quiet logs."""
import glob
import os
import re
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


# ----------------------------------------------------------------------------- one line, exit 2


def run_command(script, *args, cwd=ROOT, timeout=120):
  return subprocess.run([sys.executable, os.path.join(ROOT, script), *args],
                        capture_output=True, text=True, timeout=timeout, cwd=cwd)


def assert_one_error_line(out, starts):
  assert out.returncode == 2, out.stderr[-3000:]
  lines = out.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
  assert lines[0].startswith(f"error: {starts}"), lines[0]
  return lines[0]


@pytest.mark.parametrize("script,flags,starts", [
    ("experiments/main.py", ["--config=experiments/nosuch.py", "--workdir=/tmp/x"],
     "--config=experiments/nosuch.py: no such file 'experiments/nosuch.py'"),
    ("experiments/main.py", ["--config=experiments/fedmrl.py:nosuch", "--workdir=/tmp/x"],
     "--config=experiments/fedmrl.py:nosuch: unknown config variant 'nosuch'; valid: "),
    ("experiments/main.py", ["--config=experiments/fedmrl.py:smoke", "--workdir=/tmp/x",
                             "--config.learning_rate=abc"],
     "flag --config.learning_rate=abc: could not convert string to float: 'abc'"),
    ("experiments/main.py", ["--config=experiments/fedmrl.py:smoke"],
     "--workdir is required; --help lists the flags"),
    ("experiments/main.py", ["--config=experiments/fedmrl.py:smoke", "--workdir=/tmp/x",
                             "--wokrdir=/tmp/y"], "Unknown command line flag 'wokrdir'"),
    ("experiments/sweep.py", ["--sweep=experiments/sweeps/nosuch.py", "--sweep_dir=/tmp/x"],
     "--sweep=experiments/sweeps/nosuch.py: no such file"),
    ("experiments/sweep.py", ["--sweep=experiments/sweeps/smoke.py:cpu", "--sweep_dir=/tmp/x"],
     "--sweep=experiments/sweeps/smoke.py:cpu: experiments/sweeps/smoke.py has no variants"),
    ("experiments/sweep.py", ["--sweep=experiments/sweeps/smoke.py", "--sweep_dir=/tmp/x",
                              "--seed_batch=two"], "flag --seed_batch=two: "),
    ("experiments/sweep.py", ["--sweep=experiments/sweeps/smoke.py", "--sweep_dir=/tmp/x",
                              "--keep_checkpoints=some"],
     "flag --keep_checkpoints=some: value should be one of <all|last|none>"),
    ("experiments/flower_federation.py", ["--config=nosuch.py", "--workdir=/tmp/x"],
     "--config=nosuch.py: no such file"),
    ("experiments/flower_federation.py", ["--config=experiments/fedavg.py:nosuch",
                                          "--workdir=/tmp/x"],
     "--config=experiments/fedavg.py:nosuch: unknown config variant 'nosuch'"),
    ("experiments/flower_federation.py", ["--config=experiments/fedavg.py:smoke",
                                          "--workdir=/tmp/x", "--fault=0:explode@1"],
     "fault 'explode@1' is not kind@round"),
    ("experiments/flower_federation.py", ["--config=experiments/fedavg.py:smoke",
                                          "--workdir=/tmp/x", "--fault=x:kill@1"],
     "--fault=x:kill@1: not client:kind@round"),
])
def test_bad_command_lines_are_one_error_line(script, flags, starts):
  out = run_command(script, *flags)
  assert_one_error_line(out, starts)
  assert out.stdout == ""


def test_a_config_file_that_fails_says_where(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(arg=None):\n  return undefined_name\n")
  with pytest.raises(ValueError, match=rf"^--config={bad}: NameError: name 'undefined_name' "
                                       rf"is not defined \({bad}:2\)$"):
    cli.check_argv(["main.py", f"--config={bad}"])
  (tmp_path / "none.py").write_text("X = 1\n")
  with pytest.raises(ValueError, match="defines no get_config"):
    cli.check_argv(["main.py", f"--config={tmp_path / 'none.py'}"])


BROKEN_ALGORITHM = '''
from fedjax_het.algorithms import fedavg


def build(config, rt):
  raise RuntimeError("my algorithm cannot be built\\nsecond line")


SPEC = fedavg.SPEC._replace(build=build)
'''


def test_an_error_of_the_users_own_algorithm_is_one_line(tmp_path, synthetic_npz):
  """A plugin (``config.algorithm='package.module:SPEC'``) whose construction raises:
  one line saying where, and the whole traceback on request."""
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "__init__.py").write_text("")
  (tmp_path / "mine" / "algo.py").write_text(BROKEN_ALGORITHM)
  flags = [f"--config={ROOT}/experiments/fedavg.py:smoke", f"--workdir={tmp_path}/run",
           "--config.algorithm=mine.algo:SPEC", f"--config.data.path={synthetic_npz}",
           "--config.models=tiny"]
  out = run_command("experiments/main.py", *flags, cwd=tmp_path)
  line = assert_one_error_line(out, "RuntimeError: my algorithm cannot be built (raised in ")
  assert line.endswith(f"raised in mine/algo.py:6 (in build); {cli.TRACEBACK_ENV}=1 shows "
                       "the traceback)")
  env = dict(os.environ, **{cli.TRACEBACK_ENV: "1"})
  full = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "main.py"),
                         *flags], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                        env=env)
  assert full.returncode == 1 and "Traceback (most recent call last)" in full.stderr


def test_only_errors_raised_in_user_code_below_the_package_are_shortened(tmp_path):
  def raise_from(path):
    code = compile("def f():\n  raise KeyError('k')\n", str(path), "exec")
    namespace = {}
    exec(code, namespace)  # noqa: S102 - a function whose frames name `path`
    try:
      exec(compile("g()\n", os.path.join(cli.PACKAGE_DIR, "x.py"), "exec"),  # noqa: S102
           {"g": namespace["f"]})
    except KeyError as err:
      return err
  assert cli.user_frame(raise_from(tmp_path / "mine.py")) == f"{tmp_path}/mine.py:2 (in f)"
  assert cli.user_frame(raise_from(os.path.join(cli.PACKAGE_DIR, "y.py"))) is None
  try:
    raise KeyError("k")  # no fedjax_het frame above it: a bug of the caller's own
  except KeyError as err:
    assert cli.user_frame(err) is None


# ----------------------------------------------------------------------------- --help


def _commands():
  """experiments/*.py and benchmarks/*.py that are commands (not config files)."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    from kill_resume import is_config_file  # noqa: PLC0415
  finally:
    sys.path.pop(0)
  paths = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))
                 + glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
  return [os.path.relpath(p, ROOT) for p in paths
          if not is_config_file(p) and _runs_as_a_script(p)]


def _runs_as_a_script(path: str) -> bool:
  """Whether ``path`` is a command (a ``__main__`` block), not a module the scripts
  beside it import (``benchmarks/hlo_size.py``)."""
  with open(path) as f:
    return 'if __name__ == "__main__":' in f.read()


def defined_flags(script: str) -> list[str]:
  """The flags a command's source defines (absl ``DEFINE_*`` or argparse), in the
  command's file and the ``fedjax_het.sweeps`` module whose ``cli()`` it calls."""
  with open(os.path.join(ROOT, script)) as f:
    text = f.read()
  called = set(re.findall(r"(\w+)\.cli\b", text))  # ``runner.cli()``, ``plots.cli()``
  for module in set(re.findall(r"from fedjax_het\.sweeps import (\w+)", text)) & called:
    with open(os.path.join(ROOT, "fedjax_het", "sweeps", f"{module}.py")) as f:
      text += f.read()
  names = re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", text)
  names += re.findall(r"add_argument\(\s*\"--(\w+)\"", text)
  return names


@pytest.mark.parametrize("script", _commands())
def test_every_command_help_exits_0_and_describes_each_flag(script):
  if script == "benchmarks/torch_reference.py":
    pytest.importorskip("torch")
  names = defined_flags(script)
  assert names, f"{script}: no flags found in its source"
  out = run_command(script, "--help")
  assert out.returncode == 0, out.stderr[-2000:]
  for name in names:
    line = re.search(rf"^\s+(--{name}|--\[no\]{name})\b.*$", out.stdout, re.M)
    assert line, f"{script} --help does not describe --{name}:\n{out.stdout}"
  if "flags:" in out.stdout:  # ours (cli.help_text): a default or 'required' per flag
    described = out.stdout.split("\nflags:\n", 1)[1].split("\n\n")[0]
    entries = re.split(r"\n(?=  --)", described.strip("\n"))
    assert len(entries) == len(set(names)), described
    assert all(re.search(r"\((default: .*|required)\)$", " ".join(e.split()))
               for e in entries), described


def test_help_text_lists_defaults_and_required_flags():
  from absl import flags
  fv = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "Output directory.", flag_values=fv,
                      module_name="__main__")
  flags.DEFINE_bool("fresh_start", False, "Start over.", flag_values=fv,
                    module_name="__main__")
  flags.DEFINE_list("compare", ["a", "b"], "Two methods.", flag_values=fv,
                    module_name="__main__")
  flags.DEFINE_multi_string("fault", [], "A drill.", flag_values=fv, module_name="__main__")
  flags.DEFINE_integer("ignored", 1, "A library's flag.", flag_values=fv,
                       module_name="orbax.x")
  flags.mark_flags_as_required(["workdir"], flag_values=fv)
  assert cli.help_text("Does it.", flag_values=fv).splitlines()[:7] == [
      "Does it.", "", "flags:", "  --workdir: Output directory (required)",
      "  --[no]fresh_start: Start over (default: false)",
      "  --compare: Two methods (default: a,b)",
      "  --fault: A drill; repeatable (default: none)"]
