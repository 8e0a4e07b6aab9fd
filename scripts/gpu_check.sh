#!/usr/bin/env bash
# The GPU device check: one prepared script for the GPU machine (one H200, CUDA 13, CuPy 14, Open MPI 4.1.6,
# PyTorch, no network; docs/gpu.md records what it printed). It runs from a bare checkout: the project is
# not installed there, PYTHONPATH names the checkout (pydtnn/models and pydtnn/datasets are links inside it).
#
#   here, first:    bash scripts/gpu/gpu_check_prepare.sh      (the cuDNN frontend wheel into .gpu_data, size check)
#   on the device:  run(command="bash scripts/gpu_check.sh", carry=[".gpu_data"], timeout_s=420)
#   here, no GPU:   bash scripts/gpu_check.sh --dry-run    (the script's own logic, from an environment where
#                   the project is NOT installed too; every GPU stage reports "skipped: no GPU";
#                   tests/launch/test_check_script.py runs it)
#
# Stages, most useful first, each under its own `timeout` (capped by what is left of the budget), each
# ending with one "RESULT:" line that goes to the console and to summary.txt as soon as it ends:
#   versions 20 s (installs the carried wheel), conformance 70 s (pytest -k "gpu and not standin"),
#   bench 130 s (ResNet-50 and VGG-16 at batch 64 in tf32, fp32, fp32_strict against PyTorch, with a kernel
#   profile of each), loop 40 s (scripts/gpu/bench_loop.py: the launcher's ResNet-50 steps, their numbers read a
#   step late and at each step's end, and replayed as a CUDA graph, beside the bare step), mixed 50 s
#   (scripts/gpu/fpm_device_check.py: gpu,cpu,cpu ResNet-20 balanced by the FPM), mnist 15 s, resume 15 s,
#   nccl 10 s: 350 s of limits, budget 355 s, so that a second run still fits in a 15-minute device session.
# What comes back in $OUT (at most 5 files, no folders; the device returns at most 8):
#   summary.txt  one line per stage      gpu_check.log    every stage's whole output, appended as it runs
#   conformance.xml  pytest's JUnit XML  bench.jsonl      one JSON line per benchmark row (profile included,
#                                                          and the loop stage's rows)
#   histories.json   {"mnist": [...], "mixed_fpm": [...], "mixed_probe": [...], "mixed_dynamic": [...]}
# Work files live in a fresh folder under /tmp.
# Knobs: PYTHON (python3); GPU_CHECK_BUDGET (355 s); GPU_CHECK_LIMIT_<stage> (seconds, e.g.
# GPU_CHECK_LIMIT_bench=200); GPU_CHECK_ONLY / GPU_CHECK_SKIP ("bench mixed": stages to run / not to run);
# PYDTNN_GPU_CONV=frontend|legacy. Dry run only: GPU_CHECK_DRY_SLEEP ("conformance=3 mnist=1": seconds a
# stage's stand-in body sleeps, to exercise the limits).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
DRY=${GPU_CHECK_DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT="${OUT:-$REPO/out/gpu_check}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/pydtnn-gpu-check.XXXXXX)
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET:-355}"
ONLY=" ${GPU_CHECK_ONLY:-} "
SKIP=" ${GPU_CHECK_SKIP:-} "
MNIST="tests/data/mnist-t10k"
SUMMARY="$OUT/summary.txt"
LOG="$OUT/gpu_check.log"
HIST="$OUT/histories.json"
STAGES=(versions:20 conformance:70 bench:130 loop:40 mixed:50 mnist:15 resume:15 nccl:10)
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$REPO:$REPO/scripts/gpu:/tmp/pydtnn-gpu-site${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none    # Open MPI shared memory inside containers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
: > "$SUMMARY"
: > "$LOG"

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "$1" | tee -a "$SUMMARY" >> "$LOG"; echo "$1"; }

# stage NAME DEFAULT_LIMIT: do_NAME (or, in a dry run, dry_stage NAME) under timeout; its output appended to
# the log as it runs; one summary line (verdict, seconds, the stage's last RESULT line) when it ends
stage() {
    local name=$1 var="GPU_CHECK_LIMIT_$1" limit left t0 rc verdict result fn="do_$1"
    limit=${!var:-$2}
    if [[ "$SKIP" == *" $name "* ]] || { [[ "$ONLY" != "  " ]] && [[ "$ONLY" != *" $name "* ]]; }; then
        say "$name: skipped (GPU_CHECK_ONLY / GPU_CHECK_SKIP)"
        return 0
    fi
    left=$(( BUDGET - $(elapsed) ))
    if (( left < 10 )); then
        say "$name: not started (the ${BUDGET}s budget is spent at $(elapsed)s)"
        return 0
    fi
    (( limit > left )) && limit=$left
    (( DRY )) && fn="dry_stage $name"
    echo "=== $name (limit ${limit}s, at $(elapsed)s)" >> "$LOG"
    t0=$(date +%s)
    STAGE_LIMIT=$limit STAGE_END=$(( t0 + limit )) timeout -k 5 "$limit" bash -c "$fn" 2>&1 \
        | tee "$WORK/$name.out" >> "$LOG"
    rc=${PIPESTATUS[0]}
    verdict="ok"
    (( DRY )) && verdict="dry run ok (its GPU work skipped: no GPU)"
    (( rc != 0 )) && verdict="FAILED (rc=$rc)"
    (( rc == 124 || rc == 137 )) && verdict="TIMED OUT at its ${limit}s limit"
    result=$(grep '^RESULT: ' "$WORK/$name.out" | tail -1 | cut -c9-)
    say "$name: $verdict in $(( $(date +%s) - t0 ))s (at $(elapsed)s)${result:+: $result}"
    if (( rc != 0 )); then
        grep -v '^RESULT: ' "$WORK/$name.out" | tail -4 | sed 's/^/    | /' | cut -c1-300
    fi
    return 0
}

dry_stage() {   # a stage in a dry run (no GPU here): what of it can be checked without one
    local s
    for s in ${GPU_CHECK_DRY_SLEEP:-}; do
        [ "${s%%=*}" = "$1" ] && sleep "${s#*=}"
    done
    case $1 in
        conformance)     # the very selection of the real stage, collected
            conformance_args
            "$PY" -m pytest --collect-only -q -p no:cacheprovider -p gpu_check_deadline "${CONFORMANCE[@]}" \
                > "$WORK/collect.out" 2>&1 || { tail -5 "$WORK/collect.out"; return 1; }
            echo "RESULT: would run $(grep -c '::' "$WORK/collect.out") tests, of which" \
                 "$(grep '::' "$WORK/collect.out" | grep -ci standin) stand-in ones" ;;
        nccl)            # the helper's imports, with the PYTHONPATH the two ranks get
            dry_imports pydtnn.parallel.comm pydtnn.parallel.comm.nccl || return 1 ;;
        versions)
            dry_imports pydtnn.backends.gpu.backend pydtnn.backends.gpu.cudnn pydtnn.backends.gpu.cudnn.frontend \
                pydtnn.backends.gpu.cudnn.legacy pydtnn.backends.gpu.kernels || return 1 ;;
        bench)           # bench_gpu.py's own imports, and its zoo models built on the CPU
            dry_imports bench_gpu pydtnn.models pydtnn.parallel pydtnn.optimizers || return 1
            "$PY" -c "from pydtnn import Model; from pydtnn.models import build_model
for name in ('resnet50_imagenet', 'vgg16_imagenet'): build_model(name, Model(), input_shape=(3, 32, 32))" \
                || return 1 ;;
        loop)            # bench_loop.py's own imports
            dry_imports bench_loop bench_gpu pydtnn.training.loop pydtnn.parallel.lagged_step \
                pydtnn.backends.gpu.readback pydtnn.parallel.step_graphs pydtnn.backends.gpu.graphs || return 1
            "$PY" scripts/gpu/bench_loop.py --help > /dev/null || return 1 ;;
        mixed)           # the FPM check's imports and its policy
            dry_imports pydtnn.cli pydtnn.parallel.balance.policies || return 1
            "$PY" scripts/gpu/fpm_device_check.py --help > /dev/null || return 1 ;;
        mnist | resume)  # the launcher's imports; MNIST is in the repository
            dry_imports pydtnn.cli pydtnn.datasets pydtnn.models || return 1
            if [ "$1" != resume ]; then
                [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] && [ -f "$MNIST/t10k-labels-idx1-ubyte.gz" ] \
                    || { echo "RESULT: MNIST missing at $MNIST"; return 1; }
            fi ;;
    esac
}

dry_imports() {  # the modules a stage imports, with the check's PYTHONPATH (the checkout, not an install)
    "$PY" -c "import importlib, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    assert module.__file__.startswith('$REPO/'), f'{name} came from {module.__file__}, not the checkout'
print('RESULT: imports from the checkout:', ', '.join(sys.argv[1:]))" "$@"
}

conformance_args() {
    # the hardware parameters only (the stand-in glue tests run in CI), the GPU backend's own tests first;
    # NCCL has its own stage; the pip resolution of the GPU extras needs a network the device lacks
    CONFORMANCE=(-k "gpu and not standin and not glue" --deselect "tests/backends/test_gpu_backend.py::test_nccl_comm_single_rank[gpu]"
                 --ignore tests/backends/test_gpu_extras.py tests/backends/test_gpu_backend.py tests)
}

merge_history() {   # merge_history NAME FILE: add FILE's rows to $OUT/histories.json under NAME
    "$PY" - "$HIST" "$1" "$2" <<'EOF'
import json, os, sys
path, name, src = sys.argv[1:4]
merged = json.load(open(path)) if os.path.exists(path) else {}
merged[name] = json.load(open(src))
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(merged, f, indent=1)
os.replace(tmp, path)
EOF
}

do_versions() {
    shopt -s nullglob
    local wheels=(.gpu_data/wheels/*.whl)
    if ! "$PY" -c "import cudnn" 2>/dev/null; then
        if (( ${#wheels[@]} )); then        # offline, without dependencies (docs/gpu.md: the carried wheel)
            "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/pydtnn-gpu-site "${wheels[@]}" \
                || echo "installing the carried wheels failed"
        else
            echo "no carried wheel in .gpu_data/wheels (run scripts/gpu/gpu_check_prepare.sh before): no cuDNN frontend"
        fi
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'EOF'
import platform, numpy
print("python", platform.python_version(), "numpy", numpy.__version__)
import cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "devices", cupy.cuda.runtime.getDeviceCount())
from pydtnn.backends.gpu.cudnn import find_libcudnn
print("libcudnn found at", find_libcudnn())
have = {}
for what, probe in (("cudnn frontend", "import cudnn; print(cudnn.__version__, cudnn.backend_version_string())"),
                    ("nccl", "from cupy.cuda import nccl; print(nccl.available, nccl.get_version())"),
                    ("torch", "import torch; print(torch.__version__, torch.backends.cudnn.version())"),
                    ("mpi4py", "import mpi4py; print(mpi4py.__version__)")):
    try:
        print(what, end=": ", flush=True)
        exec(probe)
        have[what] = True
    except Exception as e:
        print("NOT AVAILABLE", type(e).__name__, e)
        have[what] = False
import numpy as np
from pydtnn.backends import ConvSpec
from pydtnn.backends.gpu.backend import GPUBackend
conv = []
for dtype, precision in (("float32", "fp32"), ("float32", "tf32"), ("float32", "fp32_strict"), ("float64", "fp32")):
    try:
        be = GPUBackend(dtype=dtype, precision=precision, deterministic=True)
        spec = ConvSpec(16, 32, (3, 3), (2, 2), (1, 1))
        x = be.asarray(np.random.default_rng(0).standard_normal((4, 16, 20, 20)))
        w = be.asarray(np.random.default_rng(1).standard_normal((32, 16, 3, 3)))
        y, ctx = be.conv2d_forward(x, w, None, spec)
        be.conv2d_backward_data(y, w, ctx, spec)
        be.conv2d_backward_weights(y, ctx, spec, True)
        be.synchronize()
        report = be.conv_report()
        print(f"conv {dtype} {precision}:", report)
        conv.append(f"{dtype}/{precision} frontend {report['served']['frontend']} legacy {report['served']['legacy']}")
    except Exception as e:
        print(f"conv {dtype} {precision}: FAILED", type(e).__name__, " ".join(str(e).split())[:400])
        conv.append(f"{dtype}/{precision} FAILED")
missing = [k for k, v in have.items() if not v]
print(f"RESULT: cupy {cupy.__version__}, {cupy.cuda.runtime.getDeviceCount()} device(s); convolutions: "
      + "; ".join(conv) + (f"; missing: {', '.join(missing)}" if missing else ""))
EOF
}

do_conformance() {
    local extra=()
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra=(--timeout 60)
    # gpu_check_deadline stops starting tests 8 s before the stage's end, so that pytest still writes its
    # JUnit XML (only at the end)
    conformance_args
    GPU_CHECK_DEADLINE=$(( STAGE_END - 8 )) "$PY" -m pytest -v -rfE -p no:cacheprovider -p gpu_check_deadline \
        "${extra[@]}" --junitxml="$OUT/conformance.xml" "${CONFORMANCE[@]}"
    local rc=$?
    "$PY" - "$OUT/conformance.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print(f"RESULT: no JUnit XML ({type(e).__name__})"); sys.exit(0)
suite = root if root.tag == "testsuite" else root.find("testsuite")
n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"RESULT: {n - f - e - s} passed, {f} failed, {e} errors, {s} skipped (of {n} run)")
EOF
    return $rc
}

do_nccl() {
    cat > "$WORK/nccl_two_ranks.py" <<'EOF'
from pydtnn.errors import ConfigError
from pydtnn.parallel.comm import make_comm
try:
    make_comm("nccl")
    print("NOT REFUSED: two ranks on one GPU built an NCCL communicator", flush=True)
except ConfigError as e:
    print(f"REFUSED as expected: {e}", flush=True)
EOF
    local rc=0 refused one
    mpirun --allow-run-as-root -np 2 -x PYTHONPATH "$PY" -m mpi4py "$WORK/nccl_two_ranks.py" > "$WORK/nccl2.out" 2>&1
    cat "$WORK/nccl2.out"
    refused=$(grep -c '^REFUSED as expected: NCCL needs one GPU per rank' "$WORK/nccl2.out")
    [ "$refused" = 2 ] || rc=1
    "$PY" -m pytest -q -rfE -p no:cacheprovider "tests/backends/test_gpu_backend.py::test_nccl_comm_single_rank[gpu]" \
        > "$WORK/nccl1.out" 2>&1
    one=$?
    cat "$WORK/nccl1.out"
    (( one != 0 )) && rc=1
    echo "RESULT: one rank: $( (( one == 0 )) && echo passed || echo FAILED); two ranks on one GPU: refused on" \
         "$refused of 2 ranks with one line"
    return $rc
}

do_mnist() {
    [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] || { echo "RESULT: MNIST missing at $MNIST"; return 2; }
    "$PY" scripts/pydtnn_benchmark.py --model simplecnn --dataset mnist --dataset_train_path "$MNIST" \
        --validation_split 0.2 --num_epochs 3 --learning_rate 0.05 --batch_size 64 --lr_schedulers "" \
        --progress_bar false --enable_gpu true --enable_cudnn_auto_conv_alg false \
        --history_file "$WORK/mnist.json" || return 1
    merge_history mnist "$WORK/mnist.json"
    "$PY" - "$WORK/mnist.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
acc = rows[-1]["val_categorical_accuracy"]
print(f"RESULT: held-out accuracy {acc:.4f} after {len(rows)} epochs on the GPU:", "OK" if acc >= 0.95 else "BELOW 0.95")
sys.exit(0 if acc >= 0.95 else 1)
EOF
}

do_bench() {
    # ResNet-50 then VGG-16 in TF32 and fp32 (the rows the goal names) first, then both in fp32_strict; each call
    # starts no configuration that cannot finish before the stage's end (--max_seconds)
    local rc=0
    "$PY" scripts/gpu/bench_gpu.py --models resnet50_imagenet,vgg16_imagenet --precision tf32,fp32 \
        --batch 64 --block 5 --rounds 5 --warmup 2 --profile --jsonl "$OUT/bench.jsonl" \
        --max_seconds $(( STAGE_END - $(date +%s) - 40 > 5 ? STAGE_END - $(date +%s) - 40 : 5 )) || rc=1
    "$PY" scripts/gpu/bench_gpu.py --models resnet50_imagenet,vgg16_imagenet --precision fp32_strict \
        --batch 64 --block 5 --rounds 5 --warmup 2 --profile --jsonl "$OUT/bench.jsonl" \
        --max_seconds $(( STAGE_END - $(date +%s) - 40 > 5 ? STAGE_END - $(date +%s) - 40 : 5 )) || rc=1
    "$PY" - "$OUT/bench.jsonl" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
done = [f"{r['model'].split('_')[0]} {r['precision']} ours {r['ours_ms']:.1f} ms"
        + (f" torch {r['torch_ms']:.1f} ms ({r['ratio']:.2f}x)" if r.get("torch_ms") else "") for r in rows if "ours_ms" in r]
print(f"RESULT: {len(done)} of 6 configurations measured" + (": " + "; ".join(done) if done else ""))
EOF
    return $rc
}

do_loop() {
    # the launcher's loop on one GPU (ResNet-50, batch 64, TF32): a step's numbers read a step late (the
    # default) against read at its end, and the bare step beside them (issue 36, item 3)
    "$PY" scripts/gpu/bench_loop.py --model resnet50_imagenet --batch 64 --precision tf32 --steps_per_epoch 8 \
        --epochs 3 --jsonl "$OUT/bench.jsonl"
}

do_resume() {
    # vgg3do has dropout: bit-exact needs the GPU generator's state in the checkpoint, deterministic cuDNN
    # plans and no autotuning (two processes could pin different plans)
    local d="$WORK/resume" common
    common=(--model vgg3do --dataset cifar10 --use_synthetic_data true --synthetic_samples 256 --batch_size 64
            --seed 5 --progress_bar false --enable_gpu true --enable_cudnn_auto_conv_alg false
            --lr_schedulers model_checkpoint --model_checkpoint_save_freq 1)
    mkdir -p "$d"
    export PYDTNN_GPU_DETERMINISTIC=1
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 2 --checkpoint_dir "$d/a" \
        --save_weights_and_bias_filename "$d/full.npz" || return 1
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 1 --checkpoint_dir "$d/b" || return 1
    "$PY" scripts/pydtnn_benchmark.py "${common[@]}" --num_epochs 2 --checkpoint_dir "$d/c" \
        --resume "$d/b/epoch_0001.npz" --save_weights_and_bias_filename "$d/resumed.npz" || return 1
    "$PY" - "$d/full.npz" "$d/resumed.npz" <<'EOF'
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
bad = [k for k in a.files if k not in b.files or not np.array_equal(a[k], b[k])]
print("RESULT: GPU resume bit-exact:", "OK" if not bad and sorted(a.files) == sorted(b.files) else f"DIFFERS in {bad}")
sys.exit(1 if bad else 0)
EOF
}

do_mixed() {
    # issue 37 on a device: one GPU replica beside two CPU replicas, ResNet-20, B = 256: the FPM split (max/min
    # compute <= 1.10, the epoch within 1.10x of the predicted makespan), the constant model and dynamic beside it
    "$PY" scripts/gpu/fpm_device_check.py --devices gpu,cpu,cpu --model resnet20_cifar10 --global_batch_size 256 \
        --steps 10 --out "$WORK/fpm" --timeout $(( STAGE_LIMIT > 20 ? STAGE_LIMIT - 10 : 10 )) | tee "$WORK/fpm.out"
    local rc=${PIPESTATUS[0]} policy
    for policy in fpm probe dynamic; do
        [ -f "$WORK/fpm/$policy.json" ] && merge_history "mixed_$policy" "$WORK/fpm/$policy.json"
    done
    echo "RESULT: $(grep -E '^(fpm|probe|dynamic): split|PASS|FAIL|unwarmed' "$WORK/fpm.out" | cut -c1-160 | paste -sd ';' -)"
    return $rc
}

export PY OUT WORK MNIST HIST REPO
export -f conformance_args do_versions do_conformance do_nccl do_mnist do_bench do_loop do_resume do_mixed dry_stage dry_imports merge_history
limits=""
total=0
for s in "${STAGES[@]}"; do
    var="GPU_CHECK_LIMIT_${s%%:*}"
    limits+=" ${s%%:*}=${!var:-${s#*:}}"
    total=$(( total + ${!var:-${s#*:}} ))
done
say "PyDTNN GPU check$( (( DRY )) && echo ' (DRY RUN: no GPU stage runs)'), $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s; stage limits (${total}s):${limits}"
for s in "${STAGES[@]}"; do
    stage "${s%%:*}" "${s#*:}"
done
nfiles=$(find "$OUT" -mindepth 1 | wc -l)
say "total: $(elapsed)s; $nfiles file(s) in \$OUT: $(cd "$OUT" && ls | paste -sd ' ' -)"
(( nfiles > 5 )) && say "WARNING: more than the 5 files this check means to bring back"
rm -rf "$WORK"
exit 0
