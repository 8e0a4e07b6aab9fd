#!/usr/bin/env bash
# The GPU device check: ONE prepared script, run on the GPU machine in under 8 minutes.
# NOT RUN ON HARDWARE as written (it was written on a machine without a GPU).
#
# What it does, each step under `timeout` and within one overall budget (GPU_CHECK_BUDGET, 460 s):
#   1. installs the carried cuDNN frontend wheel (if any) and the project (pip --no-deps, editable);
#   2. prints versions: Python, CuPy / CUDA, cuDNN (library found, frontend), NCCL, PyTorch, the GPU; and
#      which cuDNN implementation serves float32 / float64 convolutions (frontend, or legacy fallback + why);
#   3. pytest tests/test_gpu_backend.py tests/test_layers_gradients.py (conformance against the CPU backend;
#      the GPU tests run where CuPy sees a device);
#   4. trains simplecnn on the real MNIST test set through the launcher with --enable_gpu true
#      --validation_split 0.2 and checks >= 95% held-out accuracy;
#   5. a mixed job: 3 MPI ranks --devices gpu,cpu,cpu --balance static (b_i, per-replica compute/wait);
#   6. scripts/bench_gpu.py: ours vs PyTorch, fp32 and tf32 (stops starting configurations near the budget).
# Output: everything to $OUT/gpu_check.log (plus mnist_history.json, mixed_history.json, bench.json) when OUT
# is set, else to ./out/gpu_check/.
#
# BEFORE the device session, on the ordinary machine (.gpu_data/ is git-ignored, so name it in `carry`):
#   mkdir -p .gpu_data/wheels && cp -r ../shared/datasets/mnist-t10k .gpu_data/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .gpu_data/wheels \
#       nvidia-cudnn-frontend==1.32.0
# THEN, with the device tool:  run(command="bash scripts/gpu_check.sh", carry=[".gpu_data"], timeout_s=540)
# Knobs: PYTHON (default python3), GPU_CHECK_BUDGET (seconds), GPU_CHECK_SKIP (e.g. "bench mixed"),
#        PYDTNN_GPU_CONV=frontend|legacy to force one cuDNN implementation everywhere.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu_check}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET:-460}"
SKIP=" ${GPU_CHECK_SKIP:-} "
START=$(date +%s)
MNIST=".gpu_data/mnist-t10k"
[ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] || MNIST="../shared/datasets/mnist-t10k"
export PYTHONUNBUFFERED=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none    # Open MPI shared memory inside containers
exec > >(tee -a "$LOG") 2>&1
SUMMARY=()

# step NAME LIMIT_SECONDS "COMMAND": runs COMMAND (a shell line; the do_* functions are exported) under
# timeout, for LIMIT seconds or what is left of the budget, whichever is less
step() {
    local name=$1 limit=$2 cmd=$3 rc t0
    local left=$(( BUDGET - ($(date +%s) - START) ))
    if [[ "$SKIP" == *" $name "* ]]; then SUMMARY+=("$name: skipped (GPU_CHECK_SKIP)"); return 0; fi
    if (( left < 20 )); then
        SUMMARY+=("$name: not started (budget spent)")
        echo "=== $name: not started, budget spent"
        return 0
    fi
    (( limit > left )) && limit=$left
    echo; echo "=== $name (limit ${limit}s, $(( $(date +%s) - START ))s elapsed): $cmd"
    t0=$(date +%s)
    timeout -k 10 "$limit" bash -c "$cmd"
    rc=$?
    SUMMARY+=("$name: rc=$rc in $(( $(date +%s) - t0 ))s$([ $rc -eq 124 ] && echo ' (TIMED OUT)')")
    echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
    return 0
}

do_install() {
    shopt -s nullglob
    local wheels=(.gpu_data/wheels/*.whl .whl/*.whl)
    if (( ${#wheels[@]} )); then
        "$PY" -m pip install -q --no-index --no-deps "${wheels[@]}" || return 1
    else
        echo "no carried wheel (.gpu_data/wheels/*.whl): the cuDNN frontend is used only if already installed"
    fi
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
        || "$PY" -m pip install -q --no-deps --no-build-isolation .
}

do_versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'EOF'
import platform, numpy
print("python", platform.python_version(), "numpy", numpy.__version__)
import cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion(), "devices", cupy.cuda.runtime.getDeviceCount())
from pydtnn.backends._cudnn import find_libcudnn
print("libcudnn found at", find_libcudnn())
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version_string())
except Exception as e:
    print("cudnn frontend NOT importable:", type(e).__name__, e)
try:
    from cupy.cuda import nccl
    print("nccl", nccl.get_version())
except Exception as e:
    print("nccl NOT available:", type(e).__name__, e)
try:
    import mpi4py
    from mpi4py import MPI
    print("mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])
except Exception as e:
    print("mpi4py:", type(e).__name__, e)
try:
    import torch
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "cuda", torch.cuda.is_available())
except Exception as e:
    print("torch:", type(e).__name__, e)
# which cuDNN implementation serves convolutions, per dtype / precision (frontend, or legacy + why)
import numpy as np
from pydtnn.backends import ConvSpec
from pydtnn.backends.gpu import GPUBackend
for dtype, precision in (("float32", "fp32"), ("float32", "tf32"), ("float64", "fp32")):
    try:
        be = GPUBackend(dtype=dtype, precision=precision)
        spec = ConvSpec(16, 32, (3, 3), (2, 2), (1, 1))
        x = be.asarray(np.random.default_rng(0).standard_normal((4, 16, 20, 20)))
        w = be.asarray(np.random.default_rng(1).standard_normal((32, 16, 3, 3)))
        y, ctx = be.conv2d_forward(x, w, None, spec)
        be.conv2d_backward_data(y, w, ctx, spec)
        be.conv2d_backward_weights(y, ctx, spec, True)
        be.synchronize()
        print(f"conv {dtype} {precision}:", be.conv_report())
    except Exception as e:
        print(f"conv {dtype} {precision}: FAILED", type(e).__name__, " ".join(str(e).split())[:400])
EOF
}

do_mnist() {
    if [ ! -f "$MNIST/t10k-images-idx3-ubyte.gz" ]; then
        echo "MNIST missing: copy ../shared/datasets/mnist-t10k to .gpu_data/mnist-t10k and carry .gpu_data"
        return 2
    fi
    "$PY" scripts/pydtnn_benchmark.py --model simplecnn --dataset mnist --dataset_train_path "$MNIST" \
        --validation_split 0.2 --num_epochs 3 --learning_rate 0.05 --batch_size 64 --lr_schedulers "" \
        --progress_bar false --enable_gpu true --history_file "$OUT/mnist_history.json" || return 1
    "$PY" - "$OUT/mnist_history.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
acc = rows[-1]["val_categorical_accuracy"]
print(f"MNIST held-out accuracy after {len(rows)} epochs on the GPU: {acc:.4f}", "OK" if acc >= 0.95 else "BELOW 0.95")
sys.exit(0 if acc >= 0.95 else 1)
EOF
}

do_mixed() {
    local flags=()
    mpirun --version 2>&1 | grep -qi "open mpi\|open-mpi\|openrte" && flags=(--allow-run-as-root --oversubscribe)
    mpirun "${flags[@]}" -np 3 "$PY" -m mpi4py scripts/pydtnn_benchmark.py \
        --parallel data --devices gpu,cpu,cpu --balance static --model simplecnn --dataset mnist \
        --dataset_train_path "$MNIST" --validation_split 0.2 --global_batch_size 192 --num_epochs 1 \
        --learning_rate 0.05 --lr_schedulers "" --threads_per_replica 4 --progress_bar false \
        --history_file "$OUT/mixed_history.json" || return 1
    "$PY" - "$OUT/mixed_history.json" <<'EOF'
import json, sys
row = json.load(open(sys.argv[1]))[-1]
for r in range(3):
    print(f"replica {r} ({'gpu' if r == 0 else 'cpu'}): b_i={row.get(f'rank{r}_b')} "
          f"compute_s={row.get(f'rank{r}_compute_s')} wait_s={row.get(f'rank{r}_wait_s')}")
print("val_categorical_accuracy", row.get("val_categorical_accuracy"))
EOF
}

do_bench() {
    local left=$(( BUDGET - ($(date +%s) - START) ))
    "$PY" scripts/bench_gpu.py --json "$OUT/bench.json" --max_seconds $(( left > 90 ? left - 70 : 20 ))
}

export PY OUT MNIST BUDGET START
export -f do_install do_versions do_mnist do_mixed do_bench
echo "PyDTNN GPU check, $(date -u), budget ${BUDGET}s, output in $OUT"
step install 150 do_install
step versions 90 do_versions
step pytest 200 "$PY -m pytest -q -rfEs --durations=15 -p no:cacheprovider \
    tests/test_gpu_backend.py tests/test_layers_gradients.py"
step mnist 100 do_mnist
step mixed 100 do_mixed
step bench 200 do_bench
echo; echo "=== summary ($(( $(date +%s) - START ))s in all)"
printf '  %s\n' "${SUMMARY[@]}"
