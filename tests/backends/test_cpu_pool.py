"""The CPU thread pool's GIL-free jobs: every argument type arrives intact in every part, errors in a
worker part are raised on the caller, and what a job cannot carry still runs (the Python way)."""
import threading

import numpy as np
import pytest
from numba import njit

from pydtnn.backends.cpu.runtime import jobs
from pydtnn.backends.cpu.runtime.threads import POOL


@njit(nogil=True)
def _echo(t, nt, out, mat, flag, count, scale, half, small):
    """Part t writes what it received into row t of out."""
    out[t, 0] = t
    out[t, 1] = nt
    out[t, 2] = mat[1, 2]
    out[t, 3] = mat.shape[0] * 100 + mat.shape[1]
    out[t, 4] = 1.0 if flag else 0.0
    out[t, 5] = count
    out[t, 6] = scale
    out[t, 7] = half
    out[t, 8] = small


@njit(nogil=True)
def _fails_in_part_one(t, nt, out):
    if t == 1:
        raise ValueError("part one failed")
    out[t] = 1.0


def test_every_argument_type_reaches_every_part_through_a_native_job():
    nt = 3
    out = np.zeros((nt, 9))
    mat = np.arange(12, dtype=np.float32).reshape(3, 4)
    args = (out, mat, True, -(2 ** 40), 0.1, np.float32(0.3), np.int32(-7))
    assert jobs.native_job(_echo, args, np.zeros(jobs.BLOCK_WORDS, np.int64)) is not None
    POOL.run(_echo, nt, *args)
    for t in range(nt):
        assert out[t].tolist() == [t, nt, 6.0, 304, 1.0, float(-(2 ** 40)), 0.1, float(np.float32(0.3)), -7.0]


def test_a_kernel_error_in_a_worker_part_is_raised_on_the_caller():
    out = np.zeros(2)
    with pytest.raises(ValueError, match="part one failed"):
        POOL.run(_fails_in_part_one, 2, out)
    out[:] = 0
    POOL.run(_echo, 2, np.zeros((2, 9)), np.zeros((3, 4), np.float32), False, 1, 1.0, np.float32(1), np.int32(1))


def test_arguments_a_job_cannot_carry_take_the_python_way_and_give_the_same_result():
    out = np.zeros((3, 9))
    strided = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]     # not C-contiguous: no native job
    assert jobs.native_job(_echo, (out, strided, True, 1, 1.0, np.float32(1), np.int32(1)),
                           np.zeros(jobs.BLOCK_WORDS, np.int64)) is None
    POOL.run(_echo, 3, out, strided, True, 5, 2.5, np.float32(0.5), np.int32(2))
    assert out[:, 2].tolist() == [strided[1, 2]] * 3 and out[:, 0].tolist() == [0, 1, 2]
    assert jobs.native_job(lambda t, nt: None, (), np.zeros(8, np.int64)) is None    # not a numba kernel


def test_workers_that_fell_asleep_wake_for_the_next_job():
    """After an idle spell longer than the spin, the workers sleep in Python and must be woken."""
    import time
    from pydtnn.backends.cpu.runtime import threads as _cpu_pool
    out = np.zeros((4, 9))
    mat = np.ones((3, 4), np.float32)
    for _ in range(3):
        POOL.run(_echo, 4, out, mat, True, 3, 1.0, np.float32(1), np.int32(1))
        deadline = time.monotonic() + 30           # spin rounds yield the core: more spinners, longer rounds
        while any(int(POOL._ctrl[w, _cpu_pool._AWAKE]) for w in range(3)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(int(POOL._ctrl[w, _cpu_pool._AWAKE]) for w in range(3))    # they did go to sleep
    assert out[:, 0].tolist() == [0, 1, 2, 3]


def test_two_python_threads_share_the_pool():
    results = {}

    def use(tag):
        out = np.zeros((2, 9))
        for i in range(200):
            POOL.run(_echo, 2, out, np.zeros((3, 4), np.float32), False, i, 0.0, np.float32(0), np.int32(tag))
        results[tag] = out.copy()

    threads = [threading.Thread(target=use, args=(k,)) for k in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for k in (1, 2):
        assert results[k][:, 8].tolist() == [k, k] and results[k][:, 5].tolist() == [199, 199]


@pytest.mark.parametrize("name,batch", [("simplecnn", 4), ("resnet20_cifar10", 2), ("mobilenetv1_cifar10", 2),
                                        ("vit_tiny_mnist", 4)])
def test_every_kernel_of_a_training_step_runs_gil_free(monkeypatch, name, batch):
    """The fast path is the one a model gets: no numba kernel of these models' steps falls back to the
    Python way (which takes the GIL in every worker part)."""
    from pydtnn import Model
    from pydtnn.backends import get_backend
    from pydtnn.targets import one_hot
    from pydtnn.models import build_model, default_input_shape
    model = Model(backend=get_backend("cpu", "float32", 0), seed=0)
    build_model(name, model)
    model.backend.num_threads, model.backend._parallel_min = 2, 0     # every kernel through the pool
    calls, python_way = [], []
    real = jobs.native_job

    def recording(fn, args, block):
        address = real(fn, args, block)
        calls.append(fn)
        if address is None and hasattr(fn, "py_func"):
            python_way.append(fn.__name__)
        return address

    monkeypatch.setattr(jobs, "native_job", recording)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(default_input_shape(name))).astype(np.float32)
    y = one_hot(rng.integers(0, model.output_shape[0], batch), model.output_shape[0], np.float32)
    model.compute_gradients(x, y, "categorical_cross_entropy")
    assert len(calls) > 5 and python_way == []


@pytest.mark.parametrize("name,batch", [("resnet20_cifar10", 2), ("vit_tiny_mnist", 4), ("simplecnn", 4)])
def test_the_default_thread_count_reaches_every_kernel(monkeypatch, name, batch):
    """With no `num_threads` set, a kernel's thread count follows OpenBLAS's (threadpoolctl here), also when
    read inside `blas_single_thread` (OpenBLAS on one thread for the kernel's own GEMMs): such a count once
    came out 1, and strided convolutions' backward data ran on one thread whatever the user asked for."""
    from threadpoolctl import threadpool_limits

    from pydtnn import Model
    from pydtnn.backends import get_backend
    from pydtnn.models import build_model, default_input_shape
    model = Model(backend=get_backend("cpu", "float32", 0), seed=0)
    build_model(name, model)
    model.backend._parallel_min = 0                  # every kernel big enough for every thread
    counts = {}
    real = POOL.run

    def recording(fn, nt, *args):
        counts.setdefault(getattr(fn, "__name__", str(fn)), set()).add(nt)
        return real(fn, nt, *args)

    monkeypatch.setattr(POOL, "run", recording)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(default_input_shape(name))).astype(np.float32)
    with threadpool_limits(2):
        out = model.forward(x, training=True)
        model.backward(np.ones_like(out))                # the user's loop: the input gradient too
    assert len(counts) > 3
    assert {k: v for k, v in counts.items() if v != {2}} == {}
