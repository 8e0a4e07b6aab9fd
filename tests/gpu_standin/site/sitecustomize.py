"""Test-only start-up hook: with PYDTNN_GPU_STANDIN=1, install the GPU stand-in (tests/gpu_standin) for
this whole process, so that a launcher run with --enable_gpu true exercises the GPU backend's glue on a
machine without a GPU. Only tests put this folder on PYTHONPATH."""
import os
import sys

if os.environ.get("PYDTNN_GPU_STANDIN") == "1":
    tests_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, tests_dir)
    import gpu_standin
    gpu_standin.install_for_process()
