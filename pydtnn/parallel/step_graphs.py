"""--cuda_graphs: a step's forward and backward captured once as a CUDA graph and replayed (`Backend.capture`),
so the host queues one launch per step instead of a kernel per operation (about 400 for ResNet-50).

A graph replays what it captured, on the same memory with the same kernel arguments (`pydtnn.backends.gpu.
graphs`). So:
- it is captured for one shape of the batch and one loss weight, the constants of a step, after `WARMUP` eager
  steps of that shape (cuDNN's plans built and tuned, its workspace grown, every layer's buffers allocated),
  the last of them run as the capture will, on the backend's capture stream (`Backend.capture_warmup`: so,
  as in PyTorch, what the libraries keep per stream and the kernels loaded on first use exist before the
  capture); other shapes (an epoch's shorter last batch) run eagerly. One graph at a time: each keeps a
  step's activations;
- with gradient accumulation (--accumulation_steps) each micro-batch's forward and backward replays the graph
  of its shape and loss weight (its share of the local batch): micro-batches of one size share one graph, and
  of two sizes (a local batch K does not divide) the other size runs eagerly; the earlier micro-batches'
  gradients are added after each replay, outside the graph;
- the parameters, gradients and running statistics it writes must stay where they are: when any has moved
  (weights loaded into new arrays), the graph is dropped and captured again after the warm-up;
- the optimizer's update, the reduction and the step's numbers run after the graph, as before (the learning
  rate and the step count change every step); dropout draws from the generator's state of each replay;
- steps whose layers are timed one by one (traced steps) run eagerly; a capture that fails turns graphs off
  on that replica with one notice (the reason), and its steps run eagerly.
What cannot work with graphs is refused before any work (`refusal`).
"""
from __future__ import annotations

from collections import Counter

from pydtnn.backends.contract import CaptureFailed

WARMUP = 2


def refusal(nreplicas: int, gpu_replicas: int, non_blocking: bool, sync_batchnorm: bool,
            profile_layers: bool) -> str | None:
    """Why --cuda_graphs cannot run with these settings (one line), or None."""
    if gpu_replicas == 0:
        return "--cuda_graphs true needs a replica on a GPU (--enable_gpu true or --devices)"
    if nreplicas > 1 and non_blocking:
        return ("--cuda_graphs true cannot be combined with --non_blocking_mpi true: its reduction starts inside "
                "backward, from the host")
    if nreplicas > 1 and sync_batchnorm:
        return ("--cuda_graphs true cannot be combined with --sync_batchnorm true: its BatchNorm layers reduce "
                "across replicas inside forward")
    if profile_layers:
        return "--cuda_graphs true cannot time layers one by one (--profile_layers): a graph runs a step as one launch"
    return None


class StepGraphs:
    def __init__(self, model, loss, notice):
        """`notice(line)`: says once why graphs turned off on this replica."""
        self.model, self.loss, self.notice = model, loss, notice
        self.call = self.key = self.anchors = None
        self.seen = Counter()          # eager steps of each key since the last capture
        self.off = None                # why graphs are off here (said once)
        self.captures = self.replays = 0
        self.micro_batches = False     # a step ran as micro-batches (--accumulation_steps): each pass replays

    def summary(self) -> str:
        """One line: how many steps replayed a graph, or why none did."""
        if self.off is not None:
            return f"CUDA graphs: off ({self.off}); {self.replays} step(s) replayed before"
        passes = "micro-batch pass(es)" if self.micro_batches else "step(s)"
        return (f"CUDA graphs: {self.replays} {passes} replayed, {self.captures} capture(s)"
                + ("" if self.replays else f" (a batch shape is captured after {WARMUP} eager steps of it)"))

    def _anchors(self):
        """Where the memory the graph reads and writes lies (its parameters, gradients, running statistics)."""
        model = self.model
        arrays = [model.params, model.grads] + [a for layer in model.all_layers()
                                                for a in layer.state_arrays().values()]
        return tuple(a.data.ptr for a in arrays)

    def gradients(self, x, y, weight, eager, sync=False):
        """Forward + backward on (x, y) with loss weight `weight`: a replay of the step's graph where it has
        one (`sync`: then waits for the device, as `eager()` does when asked to), else `eager()` (and the
        capture once the warm-up is done)."""
        backend = self.model.backend
        if self.off is not None or self.model.layer_timer is not None:
            return eager()
        key = (tuple(x.shape), x.dtype.str, tuple(y.shape), y.dtype.str, float(weight))
        if self.call is not None and self._anchors() != self.anchors:
            self.call = self.key = self.anchors = None            # its memory moved: captured again
            self.seen.clear()
        if self.call is not None:
            if key != self.key:
                return eager()
            return self._replay(self.call, x, y, sync)
        self.seen[key] += 1
        if self.seen[key] < WARMUP:
            return eager()
        if self.seen[key] == WARMUP:                # the last one runs as the capture will (its stream)
            with backend.capture_warmup():
                return eager()
        loss, model = self.loss, self.model
        try:
            call = backend.capture(lambda xs, ys: model.compute_gradients(xs, ys, loss, loss_scale=weight), (x, y))
        except CaptureFailed as e:
            self.off = str(e)
            self.notice(f"CUDA graphs off: the step could not be captured ({e}); its steps run eagerly")
            return eager()
        self.call, self.key, self.anchors = call, key, self._anchors()
        self.captures += 1
        return self._replay(call, x, y, sync)

    def _replay(self, call, x, y, sync):
        self.replays += 1
        outputs = call.replay((x, y))
        if sync:
            self.model.backend.synchronize()
        return outputs
