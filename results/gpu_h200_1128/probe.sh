# GPU lease 2026-11-28: compile times of the claims cut (P1's first cell) under XLA's switches.
# Data: a synthetic CIFAR-10-shaped npz made here (shapes are all a compile sees).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devdata/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
mkdir -p /tmp/data
python3 -c "
import numpy as np; from fedjax_het.data import make_synthetic
r = make_synthetic(50000, 10000, 10, seed=0)
np.savez('/tmp/data/cifar10.npz', x_train=r.x_train, y_train=r.y_train, x_test=r.x_test, y_test=r.y_test)"
export FEDJAX_HET_DATA=/tmp/data
T=${PROBE_S:-430}
P="benchmarks/compile_time.py --sweep=experiments/claims/p1_classes.py --algorithm=fedmoe"
timeout $T python3 $P > $OUT/as_is.txt 2>&1 &
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $T python3 $P > $OUT/autotune0.txt 2>&1 &
JAX_THREEFRY_GPU_KERNEL_LOWERING=1 timeout $T python3 $P > $OUT/threefry.txt 2>&1 &
XLA_FLAGS=--xla_gpu_autotune_level=0 JAX_THREEFRY_GPU_KERNEL_LOWERING=1 timeout $T python3 $P > $OUT/both.txt 2>&1 &
timeout $T python3 benchmarks/init_compile.py --sweep=experiments/claims/p1_classes.py --algorithm=fedmoe --levels=0,1 > $OUT/init_levels.txt 2>&1 &
wait
for f in as_is autotune0 threefry both init_levels; do echo "== $f"; grep -v "^W1\|^I1" $OUT/$f.txt | tail -4; done
