"""What one training step does on the GPU, counted without a GPU: the proxies of its host-side cost.

The GPU backend runs over the stand-in of CuPy and cuDNN (tests/gpu_standin), which counts every kernel of
ours it launches, every allocation, synchronization and transfer (`gpu_standin.counters`), in its dry mode:
kernels and cuDNN calls are checked and counted but not computed (a step's counts do not depend on the values,
and ResNet-50's kernels would take minutes on the host). The step is the launcher's: `Trainer.fit` on a
synthetic dataset, steps 2 and 3 counted (the first builds plans and buffers). Models at 64x64 input: the
counts are the same at 224 (one launch per layer and pass, whatever the image size).

The ceilings are the issue's (ResNet-50: at most 400 of our launches and 350 allocations a step; no wait that
drains the device; one device-to-host read, lagged). A launch of ours ("launch": our RawModule kernels and
CuPy's array operations) is one kernel; a call into cuDNN or cuBLAS ("library") launches kernels of NVIDIA's
that the stand-in does not see, so they are counted apart. Measured here: ResNet-50 382 launches of ours, 161
library calls (cuDNN 158, cuBLAS 3) and 274 allocations (forward + backward alone: 373 and 267; 397 and 289
before its blocks handed their sums down, `pydtnn.execution.sum_handoff`), VGG-16 96, 47 (38 + 9) and 96;
before the kernel work, forward + backward + update alone took 919 launches and 600 allocations on
ResNet-50 (the stand-in's counting; the H200 profile's 1,054 own launches counted differently). Replayed as
a CUDA graph (--cuda_graphs): ResNet-50 11 launches, 1 graph launch and 7 allocations a step; VGG-16 12, 1, 7.
"""
import numpy as np
import pytest

import gpu_standin
from gpu_standin import counters
from pydtnn import Model
from pydtnn.callbacks import Callback
from pydtnn.datasets import from_arrays
from pydtnn.models import build_model
from pydtnn.optimizers import SGD
from pydtnn.training.loop import Trainer


class _PerStep(Callback):
    """Counts of each step: from on_batch_begin to the next step's on_batch_begin (the step's whole work,
    its record reduction and callbacks included)."""

    def __init__(self):
        self.steps, self._ctx = [], None

    def on_batch_begin(self, trainer, step):
        self._close()
        self._ctx = counters.counting()
        self.counts = self._ctx.__enter__()

    def on_train_end(self, trainer):
        self._close()

    def _close(self):
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self.steps.append(self.counts)
            self._ctx = None


def _steps(name, monkeypatch, nsteps=4, batch=2, shape=(3, 64, 64), lagged_reads=None, cuda_graphs=False):
    """Per-step counts of `nsteps` training steps of zoo model `name` on the stand-in GPU (dry)."""
    with gpu_standin.active(), counters.dry():
        from pydtnn.backends.gpu.backend import GPUBackend
        be = GPUBackend(dtype="float32", seed=0, auto_conv_alg=False)
        model = build_model(name, Model(backend=be, seed=0), nclasses=10, input_shape=shape)
        rng = np.random.default_rng(0)
        data = from_arrays(rng.standard_normal((nsteps * batch,) + shape).astype(np.float32),
                           rng.integers(0, 10, nsteps * batch))
        compute_gradients = model.compute_gradients

        def counted(*args, **kwargs):               # forward + loss + backward: its own phase
            with counters.phase("forward_backward"):
                return compute_gradients(*args, **kwargs)
        monkeypatch.setattr(model, "compute_gradients", counted)
        per_step = _PerStep()
        Trainer(model, data, SGD(learning_rate=0.01, momentum=0.9), global_batch=batch, progress=False,
                callbacks=[per_step], seed=0, lagged_reads=lagged_reads, cuda_graphs=cuda_graphs).fit(1)
        return per_step.steps


ZOO = {"resnet50": "resnet50_imagenet", "vgg16": "vgg16_imagenet"}
_COUNTED = {}


def _counted(model, lagged_reads=None, cuda_graphs=False):
    """The per-step counts of `model` (a key of ZOO), counted once per test session (with graphs: 6 steps,
    the 3rd captured)."""
    key = (model, lagged_reads, cuda_graphs)
    if key not in _COUNTED:
        mp = pytest.MonkeyPatch()
        try:
            _COUNTED[key] = _steps(ZOO[model], mp, lagged_reads=lagged_reads, cuda_graphs=cuda_graphs,
                                   nsteps=6 if cuda_graphs else 4)
        finally:
            mp.undo()
    return _COUNTED[key]


@pytest.mark.parametrize("model,launches,allocations", [("resnet50", 400, 350), ("vgg16", 150, 150)])
def test_glue_a_training_step_launches_and_allocates_little(model, launches, allocations):
    steps = _counted(model)
    for c in steps[1:3]:
        assert c.n["launch"] <= launches, (model, c.n["launch"])
        assert c.n["alloc"] <= allocations, (model, c.n["alloc"])
        # the ceiling is on ours: the libraries' calls are counted apart
        assert c.n["library"] == c.n["cudnn"] + c.n["cublas"] > 0 and "library" not in counters.KERNEL_KINDS


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_glue_a_step_never_waits_for_the_device_its_numbers_read_a_step_late(model):
    """Nothing drains the device in a step (`pydtnn.parallel.lagged_step`): forward + loss + backward never
    wait (the loss stays on the device), the compute time is the device's (events), and the one read of the
    step's loss and metrics is an asynchronous copy to pinned memory, its wait the next step's, with that
    step's work queued behind it. The epoch's last step is read at once (the epoch's row needs it).
    The read does not block: CuPy's `get` defaults to blocking=True, which synchronizes the stream of the copy
    (cupy/_core/core.pyx: `if blocking: stream.synchronize()`), a wait for the whole step; a blocking read
    counts a "d2h" and a "sync" on whatever thread makes it."""
    steps = _counted(model)
    for c in steps[1:3]:
        inside = c.phases["forward_backward"]
        assert inside["sync"] == 0 and inside["d2h"] == 0 and inside["sync_queued"] == 0, dict(inside)
        assert c.n["sync_main"] == 0 and c.n["d2h_main"] == 0, dict(c.n)
        assert c.n["d2h_async"] == 1, dict(c.n)           # this step's numbers, on their way
        assert c.n["d2h"] == 0 and c.n["sync"] == 0, dict(c.n)     # ... not waited for, on any thread
        assert c.n["sync_queued_main"] == 1, dict(c.n)    # the previous step's, arrived long ago
    assert steps[-1].n["sync_main"] == 1, dict(steps[-1].n)


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_glue_read_at_its_end_a_step_waits_twice(model):
    """`lagged_reads=False` (as several replicas run): the compute time waits for the device after backward,
    and the numbers are read at the step's end, in one transfer: the two waits lagging removes."""
    for c in _counted(model, lagged_reads=False)[1:3]:
        inside = c.phases["forward_backward"]
        assert inside["sync"] == 0 and inside["d2h"] == 0, dict(inside)
        # the wait after backward, and the read's own (a blocking get synchronizes its stream)
        assert c.n["d2h_main"] == 1 and c.n["sync_main"] == 2 and c.n["sync_queued_main"] == 0, dict(c.n)


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_glue_input_travels_pinned_and_asynchronous(model):
    """No pageable host-to-device copy on the main thread: the next batch (x and integer labels) is copied
    from pinned memory on the copy stream, by the prefetch thread."""
    for c in _counted(model)[1:3]:
        assert c.n["h2d_pageable_main"] == 0, dict(c.n)
        assert c.n["h2d_pinned"] == 2, dict(c.n)          # the next step's inputs and labels


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_glue_steps_repeat_one_kernel_sequence(model):
    """Steps of one static shape launch the same kernels in the same order (what a CUDA graph needs)."""
    steps = _counted(model)
    assert len(steps) == 4
    assert steps[1].kernels == steps[2].kernels and len(steps[1].kernels) > 100


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_glue_a_replayed_step_is_one_graph_launch(model):
    """--cuda_graphs (`pydtnn.parallel.step_graphs`): two eager steps, the third captured (its kernels recorded,
    none run) and replayed, then one graph launch a step; what stays outside the graph is the batch's copy into
    the graph's input buffers, the one-hot targets, the optimizer's update, the metrics and the lagged read."""
    steps = _counted(model, cuda_graphs=True)
    eager = _counted(model)[1]
    assert len(steps) == 6
    assert steps[1].n["graph_launch"] == 0 and steps[1].n["captured"] == 0
    assert steps[2].n["graph_launch"] == 1 and steps[2].n["captured"] == eager.phases["forward_backward"]["launch"] \
        + eager.phases["forward_backward"]["cudnn"] + eager.phases["forward_backward"]["cublas"], dict(steps[2].n)
    for c in steps[3:5]:
        assert c.n["graph_launch"] == 1 and c.n["captured"] == 0, dict(c.n)
        assert c.n["launch"] + c.n["cudnn"] + c.n["cublas"] <= 20, (c.n, c.kernels)
        assert c.n["alloc"] <= 20, dict(c.n)
        assert c.n["sync_main"] == 0 and c.n["d2h_main"] == 0 and c.n["d2h_async"] == 1, dict(c.n)
        assert c.n["h2d_pageable_main"] == 0, dict(c.n)
    assert steps[3].kernels == steps[4].kernels
