#!/usr/bin/env bash
# Run on the ordinary machine BEFORE a device session: downloads, for the device's Python 3.12 on x86-64
# Linux, the wheels that scripts/gpu_check.sh installs offline where the device lacks them (the cuDNN
# frontend above all; pytest and numba in case). Into .gpu_data/wheels (git-ignored: name .gpu_data in
# the device tool's `carry`, 64 MiB at most: the script prints the total).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .gpu_data/wheels
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .gpu_data/wheels \
    "nvidia-cudnn-frontend==1.32.0" pytest pluggy iniconfig packaging pytest-timeout tqdm threadpoolctl \
    ${GPU_CHECK_EXTRA_WHEELS-numba llvmlite}
du -sh .gpu_data
