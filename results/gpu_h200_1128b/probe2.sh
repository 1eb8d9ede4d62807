# GPU lease (session 27), second call: the Moss ablations' cell without the Triton GEMM autotuning
# that took 114 s of its 228 s compile ("config-assigner") in the first call.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devdata/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/data /tmp/logs
python3 -c "
import numpy as np; from fedjax_het.data import make_synthetic
r = make_synthetic(50000, 10000, 10, seed=0)
np.savez('/tmp/data/cifar10.npz', x_train=r.x_train, y_train=r.y_train, x_test=r.x_test, y_test=r.y_test)"
export FEDJAX_HET_DATA=/tmp/data JAX_THREEFRY_GPU_KERNEL_LOWERING=1
T=${PROBE_S:-190}
MO="benchmarks/compile_time.py --sweep=experiments/claims/moss_ablations.py --algorithm=moss"
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout $T python3 $MO > $OUT/moss_notriton.txt 2>&1 &
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $T python3 $MO > $OUT/moss_autotune0.txt 2>&1 &
wait
for f in $OUT/*.txt; do echo "== $(basename $f)"; grep -v "^[WI][0-9]" $f | tail -3; done
