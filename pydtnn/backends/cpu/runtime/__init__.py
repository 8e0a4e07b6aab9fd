"""What the CPU kernels run on: the thread pool, BLAS from numba, GIL-free jobs, the heap."""
