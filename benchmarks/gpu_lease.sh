#!/usr/bin/env bash
# One 15-minute GPU lease, prepared: only what needs a device (compile with autotuning,
# speed, accuracy), in order of value, each result left under $OUT as it is done.
# docs/performance.md ("The next lease") gives the calls, their carry lists and budgets.
#
#   bash ../shared/tools/device_stage.sh        # here, once: .devdata/ (data parts, wheels)
#   call 1 (carry part 0, boot, wheels):  source .devdata/device_boot.sh && bash benchmarks/gpu_lease.sh check
#   call 2 (carry part 1):                source .devdata/device_boot.sh && bash benchmarks/gpu_lease.sh speed
#   call 3 (carry the last part):         source .devdata/device_boot.sh && bash benchmarks/gpu_lease.sh cells
#
# check: first, the FedMoE P1 dispatch (vmap) compiled on the device with the library's
#   own options, against its deviceless figure (results/deviceless_h100/programs.jsonl):
#   past twice its CPU seconds + 60 s the compile is stopped and the call ends there, so
#   a compile problem costs one minute, not the lease. Then one round of FedMoE's and of
#   FedMRL's P1 dispatch (compile_time.py), and FedMRL's again with XLA's Triton softmax
#   rewrite left on (paired, same call): did switching the pass off slow a round?
# speed: FedMoE's P1 dispatch sequential (compile and round), and Moss's claims cell with
#   3 seeds (the library's own GPU options; about 100 s on an H200 with them set by hand).
# cells: the papers' N=100 cell for FedMoE and FedMRL, 3 seeds on the replica axis, at
#   500 rounds x 10 epochs, in the call's budget (LEASE_BUDGET_MIN, default 6.5): a run in
#   progress checkpoints, so a later lease continues it only if the checkpoints come back
#   (they do not: about 2 GB), and the finished runs' small files are packed to $OUT.
set -uo pipefail
phase=${1:?usage: gpu_lease.sh check|speed|cells}
OUT=${OUT:?set by the device tool: the folder whose files come back}
EXPECT=results/deviceless_h100/programs.jsonl
P1=benchmarks/p1_cell.py
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/lease.txt"; }
step() {  # step NAME SECONDS CMD...: runs CMD under timeout, its output to $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  log "start $name (at most ${limit} s): $*"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  grep -v '^[IW][0-9]' "$OUT/$name.txt" | tail -6 | tee -a "$OUT/lease.txt"
  log "end $name: exit $rc"
  return $rc
}
synthetic_data() {  # shapes are all a compile or a round's speed needs
  [ -n "${FEDJAX_HET_DATA:-}" ] && return
  mkdir -p /tmp/synth
  python3 -c "
import numpy as np; from fedjax_het.data import make_synthetic
r = make_synthetic(50000, 10000, 10, seed=0)
np.savez('/tmp/synth/cifar10.npz', x_train=r.x_train, y_train=r.y_train, x_test=r.x_test, y_test=r.y_test)"
  export FEDJAX_HET_DATA=/tmp/synth
  log "no data joined yet: a synthetic CIFAR-10-shaped npz (speeds and compiles only)"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  | tee -a "$OUT/lease.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/lease.txt"
git log -1 --format='code at %h %s' 2>/dev/null | tee -a "$OUT/lease.txt"

case $phase in
  check)
    synthetic_data
    step check_fedmoe_p1 300 python3 benchmarks/gpu_compile.py --on_device --sweep=$P1 \
      --algorithm=fedmoe --parallelism=vmap --expect=$EXPECT --out="$OUT/check.jsonl" \
      || { log "STOP: FedMoE's P1 dispatch did not compile within its deviceless bound"; exit 3; }
    step round_fedmoe_p1 200 python3 benchmarks/compile_time.py --sweep=$P1 --algorithm=fedmoe
    step round_fedmrl_p1 150 python3 benchmarks/compile_time.py --sweep=$P1 --algorithm=fedmrl
    # the pass left on: XLA_FLAGS naming --xla_disable_hlo_passes replace the library's
    step round_fedmrl_p1_softmax_pass_on 150 env XLA_FLAGS=--xla_disable_hlo_passes=no-such-pass \
      python3 benchmarks/compile_time.py --sweep=$P1 --algorithm=fedmrl
    ;;
  speed)
    synthetic_data
    step round_fedmoe_p1_sequential 200 python3 benchmarks/compile_time.py --sweep=$P1 \
      --algorithm=fedmoe --set=runtime.client_parallelism=sequential
    step moss_cell_3_seeds 250 python3 benchmarks/compile_time.py \
      --sweep=experiments/claims/moss_ablations.py --algorithm=moss --seeds=3
    ;;
  cells)
    [ -n "${FEDJAX_HET_DATA:-}" ] || { log "STOP: CIFAR-10 not joined (carry every part)"; exit 2; }
    budget=${LEASE_BUDGET_MIN:-6.5}
    step paper_n100 $(python3 -c "print(int($budget * 60 + 90))") python3 experiments/sweep.py \
      --sweep=experiments/sweeps/paper_n100.py --sweep_dir=results/paper_n100 \
      --sweep.algorithms=fedmoe,fedmrl --seed_batch=3 --budget_min="$budget"
    tar czf "$OUT/results.tgz" --exclude=checkpoints --exclude=xla_cache \
      --exclude=partition_indices.npz results/paper_n100
    log "packed results/paper_n100 (unpack in the project root, commit, regenerate the pages)"
    ;;
  *) echo "unknown phase $phase: check, speed or cells" >&2; exit 2 ;;
esac
