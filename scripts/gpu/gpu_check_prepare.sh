#!/usr/bin/env bash
# Run on the ordinary machine BEFORE a device session. Downloads, for the device's Python 3.12 on x86-64
# Linux, only what the device lacks for scripts/gpu_check.sh: the cuDNN frontend wheel (--no-deps; every other
# package is on the device, see docs/gpu.md), into .gpu_data/wheels (git-ignored: name .gpu_data in the
# device tool's `carry`). Then checks that what travels (the working tree: tracked and untracked-not-ignored
# files, plus .gpu_data) stays under GPU_CHECK_MAX_MIB (60; the device tool's limit is 64 MiB), and fails
# with one line if not.   --check-only: the size check alone (no download).
set -u
cd "$(dirname "$0")/../.."
MAX_MIB=${GPU_CHECK_MAX_MIB:-60}
WHEEL="nvidia-cudnn-frontend==1.32.0"
fail() { echo "gpu_check_prepare: error: $*" >&2; exit 1; }

if [ "${1:-}" != "--check-only" ]; then
    mkdir -p .gpu_data/wheels
    if ! ls .gpu_data/wheels/nvidia_cudnn_frontend-1.32.0-*.whl > /dev/null 2>&1; then
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .gpu_data/wheels "$WHEEL" \
            || fail "pip could not download $WHEEL for Python 3.12 x86-64 (see pip's message above)"
    fi
fi
tree=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
[ -n "$tree" ] || fail "cannot list the working tree with git (the device tool sends a git checkout)"
carried=0
[ -d .gpu_data ] && carried=$(du -sb .gpu_data | cut -f1)
total=$(( tree + carried ))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
if (( total > MAX_MIB * 1048576 )); then
    fail "the device run would carry $(mib $total) MiB (tree $(mib $tree) + .gpu_data $(mib $carried)), over the ${MAX_MIB} MiB limit"
fi
echo "gpu_check_prepare: ok: the device run carries $(mib $total) MiB (tree $(mib $tree) + .gpu_data $(mib $carried)) of at most ${MAX_MIB} MiB; start it with: bash scripts/gpu_check.sh, carry [\".gpu_data\"], 420 s"
