#!/usr/bin/env bash
# The GPU device check: one prepared script for the GPU machine (one H200, CUDA 13, CuPy 14, Open MPI 4.1.6,
# PyTorch 2.11, no network). At most ~6 minutes from a cold machine, so a rerun fits a 15-minute window.
# NOT RUN ON HARDWARE as written (written on a machine without a GPU; `bash -n` and the CPU-side stages
# were dry-run there).
#
# Every stage runs under its own `timeout` (capped by what is left of GPU_CHECK_BUDGET) and writes its
# results to $OUT AS IT FINISHES, so a timeout loses nothing done before it:
#   $OUT/summary.txt          one line per finished stage (rc, seconds), appended at once
#   $OUT/<stage>.log          the stage's whole output (pytest -v: one line per test as it ends)
#   $OUT/conformance.xml      JUnit XML of the conformance suite (pytest -rfE, no -x)
#   $OUT/bench.jsonl          bench_gpu.py, one JSON line per measured row, flushed
#   $OUT/*_history.json       launcher histories (MNIST, mixed static / dynamic)
# Stages: install (offline, carried wheels) -> versions -> conformance (backend "gpu") -> nccl (1 rank; and
# 2 ranks on one GPU must fail with one line) -> mnist (>= 95% on the GPU) -> resume (GPU checkpoint-resume
# bit-exact with dropout) -> mixed (gpu,cpu,cpu, static then dynamic balance) -> bench (fp32 and tf32 vs
# PyTorch, ResNet-50 and VGG-16, batch 64).
#
# BEFORE the device session, on the ordinary machine: bash scripts/gpu_check_prepare.sh (downloads the
# wheels the device lacks into .gpu_data/wheels, which is git-ignored: name it in `carry`). The MNIST t10k
# pair is in the repository (tests/data/mnist-t10k).
# THEN: run(command="bash scripts/gpu_check.sh", carry=[".gpu_data"], timeout_s=420)
# Knobs: PYTHON (python3), GPU_CHECK_BUDGET (seconds, 350), GPU_CHECK_SKIP (e.g. "bench mixed"),
#        PYDTNN_GPU_CONV=frontend|legacy (forces one cuDNN implementation where no argument says).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET:-350}"
SKIP=" ${GPU_CHECK_SKIP:-} "
START=$(date +%s)
MNIST="tests/data/mnist-t10k"
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none    # Open MPI shared memory inside containers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
: > "$SUMMARY"

elapsed() { echo $(( $(date +%s) - START )); }

# stage NAME LIMIT_SECONDS FUNCTION: FUNCTION under timeout for LIMIT seconds or what is left of the
# budget, output to $OUT/NAME.log (and the console); one summary line appended as soon as it ends
stage() {
    local name=$1 limit=$2 fn=$3 rc t0 left
    left=$(( BUDGET - $(elapsed) ))
    if [[ "$SKIP" == *" $name "* ]]; then echo "$name: skipped (GPU_CHECK_SKIP)" >> "$SUMMARY"; return 0; fi
    if (( left < 15 )); then
        echo "$name: not started (budget spent at $(elapsed)s)" | tee -a "$SUMMARY"
        return 0
    fi
    (( limit > left )) && limit=$left
    echo; echo "=== $name (limit ${limit}s, at $(elapsed)s)"
    t0=$(date +%s)
    STAGE_LIMIT=$limit timeout -k 5 "$limit" bash -c "$fn" > >(tee "$OUT/$name.log") 2>&1
    rc=$?
    local verdict="ok"
    (( rc != 0 )) && verdict="FAILED"
    (( rc == 124 || rc == 137 )) && verdict="TIMED OUT"
    echo "$name: $verdict rc=$rc in $(( $(date +%s) - t0 ))s (at $(elapsed)s)" | tee -a "$SUMMARY"
    return 0
}

do_install() {
    shopt -s nullglob
    local wheels=(.gpu_data/wheels/*.whl)
    # only what the machine lacks, offline and without dependencies (the carried set is complete)
    local need=()
    for w in "${wheels[@]}"; do
        local dist mod
        dist=$(basename "$w" | cut -d- -f1)
        case "$dist" in
            nvidia_cudnn_frontend) mod=cudnn ;; pytest_timeout) mod=pytest_timeout ;;
            *) mod=$dist ;;
        esac
        "$PY" -c "import $mod" 2>/dev/null || need+=("$w")
    done
    if (( ${#need[@]} )); then
        "$PY" -m pip install -q --no-index --no-deps "${need[@]}" || return 1
    fi
    echo "installed ${#need[@]} of ${#wheels[@]} carried wheels"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
        || "$PY" -m pip install -q --no-index --no-deps --no-build-isolation .
}

do_versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'EOF'
import platform, numpy
print("python", platform.python_version(), "numpy", numpy.__version__)
import cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "devices", cupy.cuda.runtime.getDeviceCount())
from pydtnn.backends._cudnn import find_libcudnn
print("libcudnn found at", find_libcudnn())
for what, probe in (("cudnn frontend", "import cudnn; print(cudnn.__version__, cudnn.backend_version_string())"),
                    ("nccl", "from cupy.cuda import nccl; print(nccl.available, nccl.get_version())"),
                    ("torch", "import torch; print(torch.__version__, torch.backends.cudnn.version())"),
                    ("numba", "import numba; print(numba.__version__)")):
    try:
        print(what, end=": ", flush=True)
        exec(probe)
    except Exception as e:
        print("NOT AVAILABLE", type(e).__name__, e)
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

do_conformance() {
    local extra=()
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra=(--timeout 60)
    # the "gpu" parameters only (the stand-in glue tests run in CI); -v: a line per test as it ends
    "$PY" -m pytest -v -rfE -p no:cacheprovider "${extra[@]}" --junitxml="$OUT/conformance.xml" \
        -k "not standin" tests/test_gpu_backend.py tests/test_layers_gradients.py
}

do_nccl() {
    cat > "$OUT/nccl_two_ranks.py" <<'EOF'
from pydtnn.errors import ConfigError
from pydtnn.parallel.comm import make_comm
try:
    make_comm("nccl")
    print("NOT REFUSED: two ranks on one GPU built an NCCL communicator", flush=True)
except ConfigError as e:
    print(f"REFUSED as expected: {e}", flush=True)
EOF
    local rc=0
    mpirun --allow-run-as-root -np 2 "$PY" -m mpi4py "$OUT/nccl_two_ranks.py" > "$OUT/nccl_two_ranks.out" 2>&1
    cat "$OUT/nccl_two_ranks.out"
    [ "$(grep -c '^REFUSED as expected: NCCL needs one GPU per rank' "$OUT/nccl_two_ranks.out")" = 2 ] || rc=1
    "$PY" -m pytest -v -rfE -p no:cacheprovider --junitxml="$OUT/nccl.xml" \
        "tests/test_gpu_backend.py::test_nccl_comm_single_rank[gpu]" || rc=1
    return $rc
}

do_mnist() {
    [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] || { echo "MNIST missing at $MNIST"; return 2; }
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

do_resume() {
    # vgg3do has dropout: bit-exact resume needs the GPU generator's state in the checkpoint
    local d="$OUT/resume" common
    common=(--model vgg3do --dataset cifar10 --use_synthetic_data true --synthetic_samples 512 --batch_size 64
            --seed 5 --progress_bar false --enable_gpu true --lr_schedulers model_checkpoint
            --model_checkpoint_save_freq 1)
    mkdir -p "$d"
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 2 --checkpoint_dir "$d/a" \
        --save_weights_and_bias_filename "$d/full.npz" || return 1
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 1 --checkpoint_dir "$d/b" || return 1
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 2 --checkpoint_dir "$d/c" \
        --resume "$d/b/epoch_0001.npz" --save_weights_and_bias_filename "$d/resumed.npz" || return 1
    "$PY" - "$d/full.npz" "$d/resumed.npz" <<'EOF'
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
bad = [k for k in a.files if not np.array_equal(a[k], b[k])]
print("GPU resume bit-exact:", "OK" if not bad and sorted(a.files) == sorted(b.files) else f"DIFFERS in {bad}")
sys.exit(1 if bad else 0)
EOF
}

mixed_job() {   # mixed_job static|dynamic
    mpirun --allow-run-as-root --oversubscribe -np 3 "$PY" -m mpi4py scripts/pydtnn_benchmark.py \
        --parallel data --devices gpu,cpu,cpu --balance "$1" --model simplecnn --dataset mnist \
        --dataset_train_path "$MNIST" --validation_split 0.2 --global_batch_size 192 --num_epochs 1 \
        --learning_rate 0.05 --lr_schedulers "" --threads_per_replica 4 --progress_bar false \
        --rebalance_interval 10 --history_file "$OUT/mixed_$1_history.json" || return 1
    "$PY" - "$OUT/mixed_$1_history.json" "$1" <<'EOF'
import json, sys
row = json.load(open(sys.argv[1]))[-1]
for r in range(3):
    print(f"{sys.argv[2]} replica {r} ({'gpu' if r == 0 else 'cpu'}): b_i={row.get(f'rank{r}_b')} "
          f"compute_s={row.get(f'rank{r}_compute_s')} wait_s={row.get(f'rank{r}_wait_s')}")
print(sys.argv[2], "val_categorical_accuracy", row.get("val_categorical_accuracy"))
EOF
}

do_mixed() {
    local rc=0
    mixed_job static || rc=1
    mixed_job dynamic || rc=1
    return $rc
}

do_bench() {
    # --max_seconds: start no configuration that would not finish inside the stage
    "$PY" scripts/bench_gpu.py --models resnet50_imagenet,vgg16_imagenet --precision fp32,tf32 --batch 64 \
        --steps 8 --warmup 2 --jsonl "$OUT/bench.jsonl" --json "$OUT/bench.json" \
        --max_seconds $(( STAGE_LIMIT > 60 ? STAGE_LIMIT - 45 : 10 ))
}

export PY OUT MNIST
export -f do_install do_versions do_conformance do_nccl do_mnist do_resume mixed_job do_mixed do_bench
echo "PyDTNN GPU check, $(date -u), budget ${BUDGET}s, output in $OUT" | tee -a "$SUMMARY"
stage install 25 do_install
stage versions 20 do_versions
stage conformance 80 do_conformance
stage nccl 25 do_nccl
stage mnist 40 do_mnist
stage resume 35 do_resume
stage mixed 45 do_mixed
stage bench 150 do_bench
echo "total: $(elapsed)s" | tee -a "$SUMMARY"
echo; echo "=== summary"; cat "$SUMMARY"
