#!/usr/bin/env bash
# For a GPU machine without internet access: run this where there is a network, then copy the checkout, with
# its .wheels folder, to the GPU machine and run `bash scripts/gpu_check.sh` there. It downloads the one package
# such a machine most often lacks for the check, the cuDNN frontend (--no-deps: CuPy, cuDNN, NCCL and the rest
# must already be installed there; docs/gpu.md), built for the GPU machine's Python and platform, into .wheels
# (git-ignored); the check's first stage installs it from there. Then it checks that the copy (the checkout's
# files, without ignored ones, plus .wheels) stays under GPU_CHECK_MAX_MIB, for transfers with a size cap,
# and fails with one line if not.   --check-only: the size check alone (no download).
# Knobs: GPU_CHECK_WHEEL (nvidia-cudnn-frontend==1.32.0, a name==version), GPU_CHECK_WHEEL_PYTHON (3.12: the
# GPU machine's Python), GPU_CHECK_WHEEL_PLATFORM (x86_64 or aarch64), GPU_CHECK_MAX_MIB (60).
set -u
cd "$(dirname "$0")/../.."
MAX_MIB=${GPU_CHECK_MAX_MIB:-60}
WHEEL=${GPU_CHECK_WHEEL:-nvidia-cudnn-frontend==1.32.0}
TARGET_PYTHON=${GPU_CHECK_WHEEL_PYTHON:-3.12}
ARCH=${GPU_CHECK_WHEEL_PLATFORM:-x86_64}
WHEELS=.wheels
fail() { echo "gpu_check_prepare: error: $*" >&2; exit 1; }

if [ "${1:-}" != "--check-only" ]; then
    mkdir -p "$WHEELS"
    name=${WHEEL%%==*}
    if ! ls "$WHEELS/${name//-/_}-${WHEEL#*==}-"*.whl > /dev/null 2>&1; then
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" \
            --implementation cp --platform "manylinux_2_28_$ARCH" --platform "manylinux_2_27_$ARCH" \
            --platform "manylinux_2_17_$ARCH" --platform "manylinux2014_$ARCH" -d "$WHEELS" "$WHEEL" \
            || fail "pip could not download $WHEEL for Python $TARGET_PYTHON on $ARCH Linux (see pip's message above)"
    fi
fi
tree=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
[ -n "$tree" ] || fail "cannot list the checkout's files with git (the size check needs a git checkout)"
wheels=0
[ -d "$WHEELS" ] && wheels=$(du -sb "$WHEELS" | cut -f1)
total=$(( tree + wheels ))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
if (( total > MAX_MIB * 1048576 )); then
    fail "the copy for the GPU machine would be $(mib $total) MiB (tree $(mib $tree) + $WHEELS $(mib $wheels)), over the ${MAX_MIB} MiB limit (GPU_CHECK_MAX_MIB)"
fi
echo "gpu_check_prepare: ok: the copy for the GPU machine is $(mib $total) MiB (tree $(mib $tree) + $WHEELS $(mib $wheels)), under the ${MAX_MIB} MiB limit; copy the checkout with $WHEELS there and run: bash scripts/gpu_check.sh"
