#!/usr/bin/env bash
# The GPU check: what only a GPU can show about PyDTNN's GPU backend, in one command and about 6 minutes.
# docs/gpu.md says what to install, what it prints, and what a pass and a failure look like.
#
#   bash scripts/gpu_check.sh             on a machine with an NVIDIA GPU, after `pip install -e ".[gpu]"` (CUDA
#                                          12) or `pip install -e ".[gpu13]"` (CUDA 13), never both. It also runs
#                                          from a checkout that is not installed: it puts the checkout first on
#                                          PYTHONPATH (and restores the pydtnn/models and pydtnn/datasets links
#                                          if a copy lost them).
#   bash scripts/gpu_check.sh --dry-run   anywhere, no GPU needed: the script's own logic; each stage checks what
#                                          it can without a GPU (its imports from the checkout, the tests it
#                                          would select) and says "skipped: no GPU" for the rest
#
# Stages, the decisive ones first, each under its own limit (seconds), each ending with one "RESULT:" line that
# goes to the console and to summary.txt as soon as it ends:
#   versions 20      versions of CUDA, CuPy, cuDNN, NCCL, PyTorch; one convolution per precision
#   decisive 35      the tests that decide the rest: graphed steps replay the eager ones bit for bit on the
#                    device, and our fused kernels (compiled by NVRTC) equal NumPy
#   conformance 50   the other device tests (pytest -k "gpu and not standin and not glue")
#   bench 125        scripts/gpu/bench_gpu.py: ResNet-50 and VGG-16, batch 64, tf32/fp32/fp32_strict against
#                    PyTorch, with a kernel profile of each
#   loop 40          scripts/gpu/bench_loop.py: the launcher's ResNet-50 steps read a step late, read at each
#                    step's end, and replayed as a CUDA graph, beside the bare step
#   mixed 40         scripts/gpu/fpm_device_check.py: gpu,cpu,cpu ResNet-20 balanced by the FPM
#   mnist 15, resume 15, nccl 10
# A stage ends by itself before its limit (the benchmarks check the time before each row and each round, pytest
# starts no test past the stage's deadline) and then reports "stopped at its limit": not a failure. A stage
# still running at its limit is stopped by `timeout` and reported the same way. A stage that fails says
# "FAILED" with the last lines of its output. The last line: "check passed", "check incomplete" (no stage
# failed, but one stopped at its limit or did not start; exit status 0 for both) or "check FAILED: <stages>"
# (exit status 1).
# What it writes in $OUT: summary.txt (one line per stage), gpu_check.log (every stage's whole output, as it
# runs), conformance.xml (pytest's JUnit XML of the decisive and conformance stages), bench.jsonl (one JSON line
# per benchmark row, its kernel profile included, and the loop stage's rows), histories.json (the training
# runs' histories). Work files live in a fresh folder under /tmp, removed at the end.
# Knobs (environment variables):
#   OUT                       where the results go (out/gpu_check in the checkout)
#   PYTHON                    the Python to run (python3)
#   GPU_CHECK_LIMIT_<stage>   a stage's limit in seconds, e.g. GPU_CHECK_LIMIT_bench=300
#   GPU_CHECK_ONLY, _SKIP     stages to run / not to run, e.g. GPU_CHECK_ONLY="decisive bench"
#   GPU_CHECK_TOTAL_LIMIT     the whole check's limit (the stage limits' sum + 5): a stage that would start
#                             with under 10 s of it left does not start
#   GPU_CHECK_WHEELS          a folder of wheels the versions stage installs from if the cuDNN frontend is
#                             missing (.wheels: scripts/gpu/gpu_check_prepare.sh, for a machine without internet)
#   PYDTNN_GPU_CONV           frontend|legacy: which cuDNN API our convolutions use (auto)
#   GPU_CHECK_DRY_SLEEP       dry run only: "conformance=3 mnist=1", seconds a stage's dry body sleeps, to
#                             exercise the limits
#   GPU_CHECK_DEADLINE_MARGIN seconds before a pytest stage's limit after which it starts no test (8), so that
#                             pytest ends by itself and writes its JUnit XML
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
DRY=${GPU_CHECK_DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT="${OUT:-$REPO/out/gpu_check}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/pydtnn-gpu-check.XXXXXX)
PY="${PYTHON:-python3}"
ONLY=" ${GPU_CHECK_ONLY:-} "
SKIP=" ${GPU_CHECK_SKIP:-} "
WHEELS="${GPU_CHECK_WHEELS:-$REPO/.wheels}"
MNIST="tests/data/mnist-t10k"
SUMMARY="$OUT/summary.txt"
LOG="$OUT/gpu_check.log"
HIST="$OUT/histories.json"
STAGES=(versions:20 decisive:35 conformance:50 bench:125 loop:40 mixed:40 mnist:15 resume:15 nccl:10)
# the decisive tests, by name (the dry run fails if one is not found)
DECISIVE="test_gpu_graphed_steps_train_exactly_as_eager_steps_on_the_device
test_elementwise_kernels_packed_unpacked_and_per_plane
test_batchnorm_fused_relu_addend_and_running_stats_equal_the_separate_passes"
DECISIVE=$(echo $DECISIVE)      # one line, one space between names
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$REPO:$REPO/scripts/gpu:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none    # Open MPI shared memory inside containers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
: > "$SUMMARY"
: > "$LOG"
rm -f "$OUT/conformance.xml" "$OUT/bench.jsonl" "$HIST"     # an earlier run's results are not this run's

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "$1" | tee -a "$SUMMARY" >> "$LOG"; echo "$1"; }

# a copy of the checkout can lose the two links the package needs (or hold them as text files, as git does
# where links are off): link them again
restore_links() {
    local name restored=""
    for name in models datasets; do
        if [ ! -d "pydtnn/$name" ] && [ -d "$name" ]; then
            rm -f "pydtnn/$name" && ln -s "../$name" "pydtnn/$name" && restored+=" pydtnn/$name -> ../$name"
        fi
    done
    [ -n "$restored" ] && echo "checkout: restored the link(s)$restored"
}

# stage NAME DEFAULT_LIMIT: do_NAME (or, in a dry run, dry_stage NAME) under timeout; its output appended to
# the log as it runs; one summary line (verdict, seconds, the stage's last RESULT line) when it ends
stage() {
    local name=$1 var="GPU_CHECK_LIMIT_$1" limit left t0 rc verdict result stopped fn="do_$1"
    limit=${!var:-$2}
    if [[ "$SKIP" == *" $name "* ]] || { [[ "$ONLY" != "  " ]] && [[ "$ONLY" != *" $name "* ]]; }; then
        say "$name: skipped (GPU_CHECK_ONLY / GPU_CHECK_SKIP)"
        return 0
    fi
    left=$(( TOTAL_LIMIT - $(elapsed) ))
    if (( left < 10 )); then
        say "$name: not started (the check's ${TOTAL_LIMIT}s total limit is spent at $(elapsed)s)"
        NOT_STARTED+=" $name"
        return 0
    fi
    (( limit > left )) && limit=$left
    (( DRY )) && fn="dry_stage $name"
    echo "=== $name (limit ${limit}s, at $(elapsed)s)" >> "$LOG"
    t0=$(date +%s)
    STAGE_LIMIT=$limit STAGE_END=$(( t0 + limit )) timeout -k 5 "$limit" bash -c "$fn" 2>&1 \
        | tee "$WORK/$name.out" >> "$LOG"
    rc=${PIPESTATUS[0]}
    stopped=$(grep '^STOPPED: ' "$WORK/$name.out" | tail -1)
    verdict="ok"
    (( DRY )) && verdict="dry run ok (its GPU work skipped: no GPU)"
    [ -n "$stopped" ] && verdict="stopped at its ${limit}s limit"
    (( rc != 0 )) && verdict="FAILED (rc=$rc)"
    (( rc == 124 || rc == 137 )) && verdict="stopped at its ${limit}s limit (by timeout)"
    case $verdict in
        FAILED*) FAILED_STAGES+=" $name" ;;
        stopped*) STOPPED_STAGES+=" $name" ;;
    esac
    result=$(grep '^RESULT: ' "$WORK/$name.out" | tail -1 | cut -c9-)
    say "$name: $verdict in $(( $(date +%s) - t0 ))s (at $(elapsed)s)${result:+: $result}"
    if [[ $verdict == FAILED* ]]; then
        grep -v '^RESULT: ' "$WORK/$name.out" | tail -4 | sed 's/^/    | /' | cut -c1-300
    elif [ -n "$stopped" ]; then
        echo "    | $stopped" | cut -c1-300
    fi
    return 0
}

dry_stage() {   # a stage in a dry run (no GPU here): what of it can be checked without one
    local s
    for s in ${GPU_CHECK_DRY_SLEEP:-}; do
        [ "${s%%=*}" = "$1" ] && sleep "${s#*=}"
    done
    case $1 in
        decisive)        # the very selection of the real stage, collected: every decisive test is found
            dry_collect decisive || return 1
            local name missing=()
            for name in $DECISIVE; do
                grep -q "::$name" "$WORK/decisive.collect" || missing+=("$name")
            done
            (( ${#missing[@]} == 0 )) || { echo "RESULT: decisive test(s) not found: ${missing[*]}"; return 1; } ;;
        conformance)
            dry_collect conformance || return 1 ;;
        nccl)            # the helper's imports, with the PYTHONPATH the two ranks get
            dry_imports pydtnn.parallel.comm pydtnn.parallel.comm.nccl pydtnn.parallel.runtime.mpirun || return 1 ;;
        versions)
            dry_imports pydtnn.backends.gpu.backend pydtnn.backends.gpu.cudnn pydtnn.backends.gpu.cudnn.frontend \
                pydtnn.backends.gpu.cudnn.legacy pydtnn.backends.gpu.kernels || return 1 ;;
        bench)           # bench_gpu.py's own imports, and its zoo models built on the CPU
            dry_imports bench_gpu time_limit pydtnn.models pydtnn.parallel pydtnn.optimizers || return 1
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

dry_collect() {  # dry_collect STAGE: the pytest selection of a stage, collected
    selection "$1"
    "$PY" -m pytest --collect-only -q -p no:cacheprovider -p gpu_check_deadline "${SELECTION[@]}" \
        > "$WORK/$1.collect" 2>&1 || { tail -5 "$WORK/$1.collect"; return 1; }
    echo "RESULT: would run $(grep -c '::' "$WORK/$1.collect") tests, of which" \
         "$(grep '::' "$WORK/$1.collect" | grep -ci standin) stand-in ones"
}

selection() {    # selection STAGE: SELECTION, the pytest arguments of the decisive or the conformance stage
    # the hardware parameters only (the stand-in and glue tests run everywhere, without a GPU); NCCL has its
    # own stage; the pip resolution of the GPU extras is not the device's business
    local names="(${DECISIVE// / or })"
    if [ "$1" = decisive ]; then
        SELECTION=(-k "gpu and not standin and not glue and $names"
                   tests/training/test_cuda_graphs.py tests/backends/test_gpu_backend.py)
    else
        SELECTION=(-k "gpu and not standin and not glue and not $names"
                   --deselect "tests/backends/test_gpu_backend.py::test_nccl_comm_single_rank[gpu]"
                   --ignore tests/backends/test_gpu_extras.py tests/backends/test_gpu_backend.py tests)
    fi
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

seconds_left() {    # seconds_left MARGIN: what is left of the stage's limit, less MARGIN (at least 5)
    local left=$(( STAGE_END - $(date +%s) - $1 ))
    echo $(( left > 5 ? left : 5 ))
}

do_versions() {
    shopt -s nullglob
    local wheels=("$WHEELS"/*.whl)
    if ! "$PY" -c "import cudnn" 2>/dev/null; then
        if (( ${#wheels[@]} )); then        # offline, without dependencies (scripts/gpu/gpu_check_prepare.sh)
            "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "${wheels[@]}" \
                || echo "installing the wheels of $WHEELS failed"
        else
            echo "no cuDNN frontend: pip install -e \".[gpu]\" (or \".[gpu13]\") brings it; without it our" \
                 "convolutions run on cuDNN's legacy API"
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

# pytest_stage NAME: the stage's selection under the deadline plugin (it starts no test GPU_CHECK_DEADLINE_MARGIN
# (8) s before the stage's end, so that pytest still writes its JUnit XML, which it writes only at the end); its tests' counts
pytest_stage() {
    local extra=() rc
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra=(--timeout 60)
    selection "$1"
    GPU_CHECK_DEADLINE=$(( STAGE_END - ${GPU_CHECK_DEADLINE_MARGIN:-8} )) \
        "$PY" -m pytest -v -rfEs -p no:cacheprovider -p gpu_check_deadline \
        "${extra[@]}" --junitxml="$WORK/$1.xml" "${SELECTION[@]}" 2>&1 | tee "$WORK/$1.pytest"
    rc=${PIPESTATUS[0]}
    "$PY" - "$1" "$WORK" "$OUT/conformance.xml" "$rc" <<'EOF'
import os, re, sys, xml.etree.ElementTree as ET
name, work, merged, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    root = ET.parse(os.path.join(work, name + ".xml")).getroot()
except Exception as e:
    print(f"RESULT: no JUnit XML ({type(e).__name__}); pytest exited with {rc}"); sys.exit(1)
suite = root if root.tag == "testsuite" else root.find("testsuite")
suite.set("name", name)
both = ET.parse(merged).getroot() if os.path.exists(merged) else ET.Element("testsuites")
both[:] = [s for s in both if s.get("name") != name] + [suite]    # one testsuite per stage
ET.ElementTree(both).write(merged + ".tmp", encoding="utf-8", xml_declaration=True)
os.replace(merged + ".tmp", merged)
n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
text = open(os.path.join(work, name + ".pytest"), errors="replace").read()
selected = re.search(r"(\d+) selected", text)
failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
print(f"RESULT: {n - f - e - s} passed, {f} failed, {e} errors, {s} skipped (of {n} run)"
      + (f"; failed: {', '.join(failed)}"[:300] if failed else ""))
if f or e:
    sys.exit(1)
if "gpu_check deadline reached" in text:
    left = int(selected.group(1)) - n if selected else "some"
    print(f"STOPPED: the stage's deadline: {left} test(s) not run")
    sys.exit(0)
if name == "decisive" and s:          # a decisive test that skips has not shown anything
    print(f"{s} decisive test(s) skipped: is the GPU backend usable here? (see the versions stage)")
    sys.exit(1)
sys.exit(rc)
EOF
}

do_decisive() {
    pytest_stage decisive
}

do_conformance() {
    pytest_stage conformance
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
    local rc=0 refused one command
    command=$("$PY" -c "import shlex, sys
from pydtnn.parallel.runtime.mpirun import mpi_command
print(shlex.join(mpi_command(2, sys.argv[1])))" "$WORK/nccl_two_ranks.py") || return 1
    eval "$command" > "$WORK/nccl2.out" 2>&1
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
    # ResNet-50 then VGG-16 in TF32 and fp32 first, then both in fp32_strict; each call ends by itself before
    # the stage's end (--max_seconds: it checks the time before each row, round and profile; the second
    # call knows from the first's rows how long a row takes)
    local rc=0
    "$PY" scripts/gpu/bench_gpu.py --models resnet50_imagenet,vgg16_imagenet --precision tf32,fp32 \
        --batch 64 --block 5 --rounds 5 --warmup 2 --profile --jsonl "$OUT/bench.jsonl" \
        --max_seconds "$(seconds_left 10)" || rc=1
    "$PY" scripts/gpu/bench_gpu.py --models resnet50_imagenet,vgg16_imagenet --precision fp32_strict \
        --batch 64 --block 5 --rounds 5 --warmup 2 --profile --jsonl "$OUT/bench.jsonl" \
        --max_seconds "$(seconds_left 10)" --estimates_from "$OUT/bench.jsonl" || rc=1
    "$PY" - "$OUT/bench.jsonl" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
rows = [r for r in rows if "mode" not in r]                   # the loop stage's rows are its own
done = [f"{r['model'].split('_')[0]} {r['precision']} ours {r['ours_ms']:.1f} ms"
        + (f" torch {r['torch_ms']:.1f} ms ({r['ratio']:.2f}x)" if r.get("torch_ms") else "") for r in rows if "ours_ms" in r]
print(f"RESULT: {len(done)} of 6 configurations measured" + (": " + "; ".join(done) if done else ""))
EOF
    return $rc
}

do_loop() {
    # the launcher's loop on one GPU (ResNet-50, batch 64, TF32): a step's numbers read a step late (the
    # default) against read at its end, and replayed as a CUDA graph, beside the bare step
    "$PY" scripts/gpu/bench_loop.py --model resnet50_imagenet --batch 64 --precision tf32 --steps_per_epoch 8 \
        --epochs 3 --jsonl "$OUT/bench.jsonl" --max_seconds "$(seconds_left 5)"
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
    # one GPU replica beside two CPU replicas, ResNet-20, B = 256: the FPM split (max/min compute <= 1.10, the
    # epoch within 1.10x of the predicted makespan), the constant model and dynamic beside it
    "$PY" scripts/gpu/fpm_device_check.py --devices gpu,cpu,cpu --model resnet20_cifar10 --global_batch_size 256 \
        --steps 10 --out "$WORK/fpm" --max_seconds "$(seconds_left 5)" | tee "$WORK/fpm.out"
    local rc=${PIPESTATUS[0]} policy
    for policy in fpm probe dynamic; do
        [ -f "$WORK/fpm/$policy.json" ] && merge_history "mixed_$policy" "$WORK/fpm/$policy.json"
    done
    echo "RESULT: $(grep -E '^(fpm|probe|dynamic): split|PASS|FAIL|unwarmed' "$WORK/fpm.out" | cut -c1-160 | paste -sd ';' -)"
    return $rc
}

export PY OUT WORK MNIST HIST REPO WHEELS DECISIVE
export -f selection pytest_stage seconds_left do_versions do_decisive do_conformance do_nccl do_mnist do_bench \
    do_loop do_resume do_mixed dry_stage dry_imports dry_collect merge_history
limits=""
total=0
for s in "${STAGES[@]}"; do
    var="GPU_CHECK_LIMIT_${s%%:*}"
    limits+=" ${s%%:*}=${!var:-${s#*:}}"
    total=$(( total + ${!var:-${s#*:}} ))
done
TOTAL_LIMIT="${GPU_CHECK_TOTAL_LIMIT:-$(( total + 5 ))}"
FAILED_STAGES="" STOPPED_STAGES="" NOT_STARTED=""
restored=$(restore_links)
say "PyDTNN GPU check$( (( DRY )) && echo ' (DRY RUN: no GPU stage runs)'), $(date -u +%Y-%m-%dT%H:%M:%SZ), total limit ${TOTAL_LIMIT}s; stage limits (${total}s):${limits}"
[ -n "$restored" ] && say "$restored"
for s in "${STAGES[@]}"; do
    stage "${s%%:*}" "${s#*:}"
done
nfiles=$(find "$OUT" -mindepth 1 | wc -l)
say "total: $(elapsed)s; $nfiles file(s) in \$OUT: $(cd "$OUT" && ls | paste -sd ' ' -)"
rm -rf "$WORK"
# the verdict: failed (exit status 1) if a stage failed; else passed, or incomplete where a stage stopped at its
# limit or did not start (raise GPU_CHECK_LIMIT_<stage> or GPU_CHECK_TOTAL_LIMIT)
partial="${STOPPED_STAGES:+; stopped at its limit:$STOPPED_STAGES}${NOT_STARTED:+; not started:$NOT_STARTED}"
if [ -n "$FAILED_STAGES" ]; then
    say "check FAILED:$FAILED_STAGES$partial"
    exit 1
elif [ -n "$partial" ]; then
    say "check incomplete: no stage failed$partial"
else
    say "check passed: no stage failed"
fi
exit 0
