# GPU lease (session 27): where the claims cut's dispatch compile goes on the GPU.
# Data: a synthetic CIFAR-10-shaped npz made here (shapes are all a compile sees).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devdata/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" | tee -a $OUT/summary.txt
mkdir -p /tmp/data /tmp/logs
python3 -c "
import numpy as np; from fedjax_het.data import make_synthetic
r = make_synthetic(50000, 10000, 10, seed=0)
np.savez('/tmp/data/cifar10.npz', x_train=r.x_train, y_train=r.y_train, x_test=r.x_test, y_test=r.y_test)"
export FEDJAX_HET_DATA=/tmp/data
T=${PROBE_S:-470}
V="TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1,hlo_pass_pipeline=1"
K="JAX_THREEFRY_GPU_KERNEL_LOWERING=1"
P1="benchmarks/compile_time.py --sweep=experiments/claims/p1_classes.py"
MO="benchmarks/compile_time.py --sweep=experiments/claims/moss_ablations.py --algorithm=moss"
SEQ="--set=runtime.client_parallelism=sequential"
run() { local name=$1; shift; (date +%s.%N; env "$@"; echo "exit $?") > /tmp/logs/$name.txt 2>&1; }
run fedmoe_vmap $V $K timeout $T python3 $P1 --algorithm=fedmoe &
run fedmoe_seq $V $K timeout $T python3 $P1 --algorithm=fedmoe $SEQ &
run fedmoe_nocmdbuf $V $K XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout $T python3 $P1 --algorithm=fedmoe &
run fedmoe_notriton $V $K "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false" timeout $T python3 $P1 --algorithm=fedmoe &
run standalone_vmap $V $K timeout $T python3 $P1 --algorithm=standalone &
run moss_vmap $V $K timeout $T python3 $MO &
run moss_seq $V $K timeout $T python3 $MO $SEQ &
(run bits_off timeout 200 python3 .devdata/threefry_bits.py /tmp/logs/bits_off.npz; run bits_on $K timeout 100 python3 .devdata/threefry_bits.py /tmp/logs/bits_on.npz) &
wait
python3 -c "
import numpy as np
a, b = (np.load(f'/tmp/logs/bits_{s}.npz')['digests'] for s in ('off', 'on'))
print(f'threefry kernel on vs off: same bits in {int((a == b).sum())} of {len(a)} leaves')" >> $OUT/summary.txt 2>&1
for f in /tmp/logs/*.txt; do echo "== $(basename $f) ($(wc -l < $f) lines)"; grep -v "^[WI][0-9]" $f | tail -4; done >> $OUT/summary.txt
tar cJf $OUT/logs.tar.xz -C /tmp logs
cat $OUT/summary.txt
