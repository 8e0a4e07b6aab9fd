"""--cuda_graphs beyond ResNet: the zoo's ResNet-50 (with its FC), VGG-16, the ViT and the byte language model
(Embedding, attention, LayerNorm) capture a training step with no refused call, and the replay equals the
eager step BIT FOR BIT on the host stand-in of CuPy/cuDNN/cuBLAS (`tests/gpu_standin`), which refuses in a
capture what CuPy and CUDA refuse (a read to the host, cuBLAS through CuPy, a wait...) and runs the real CUDA
kernels on the CPU.

Each model: one eager step inside `capture_warmup()` (the last warm-up, on the capture stream: the step the
replay must equal), the capture on ANOTHER batch (its inputs are copied in at each replay), then a replay of
the eager step's batch from the same state: loss, predictions, gradients and running statistics compared.
Small batches and inputs keep it fast; ResNet-50's 53 BatchNorm layers are slow on the stand-in's emulated
thread blocks (about a minute a pass), hence its mark.
"""
import numpy as np
import pytest

import gpu_standin
from pydtnn import Model
from pydtnn.losses import get_loss
from pydtnn.models import build_model

ZOO = {     # name -> (builder options, the batch)
    "resnet50_imagenet": dict(nclasses=10, input_shape=(3, 32, 32)),
    "vgg16_imagenet": dict(nclasses=10, input_shape=(3, 32, 32)),
    "vit_tiny_mnist": dict(nclasses=10, input_shape=(1, 28, 28)),
    "bytelm_small": dict(nclasses=256, input_shape=(16,)),
}
BATCH = 2


def _batch(backend, name, seed):
    """(x, y) on the device: images and one-hot classes, or byte ids and their next bytes one-hot."""
    rng = np.random.default_rng(seed)
    options = ZOO[name]
    k = options["nclasses"]
    if name == "bytelm_small":
        ids = rng.integers(0, k, (BATCH,) + options["input_shape"])
        return backend.xp.asarray(ids), backend.asarray(np.eye(k)[(ids + 1) % k])
    x = rng.standard_normal((BATCH,) + options["input_shape"])
    return backend.asarray(x), backend.asarray(np.eye(k)[rng.integers(0, k, BATCH)])


def _host(model, value, y_pred):
    return {"loss": float(value), "y_pred": y_pred.get(), "grads": model.grads.get(), **model.state_arrays()}


@pytest.mark.parametrize("name", [pytest.param("resnet50_imagenet", marks=pytest.mark.slow),
                                  "vgg16_imagenet", "vit_tiny_mnist", "bytelm_small"])
def test_a_zoo_model_replays_its_eager_step_bit_for_bit(name):
    from pydtnn.backends.gpu.backend import GPUBackend
    loss = get_loss("categorical_cross_entropy")
    with gpu_standin.active():
        be = GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)
        model = build_model(name, Model(backend=be, seed=0), **ZOO[name])
        x, y = _batch(be, name, seed=1)
        before, offset = model.state_arrays(), be.rng.offset
        with be.capture_warmup():
            eager = _host(model, *model.compute_gradients(x, y, loss))
        other = _batch(be, name, seed=2)
        call = be.capture(lambda xs, ys: model.compute_gradients(xs, ys, loss), other)
        model.load_state_arrays(before)             # in place: the arrays the graph writes stay where they are
        model.grads[...] = 0
        be.rng.offset = offset
        replayed = _host(model, *call.replay((x, y)))
    assert set(replayed) == set(eager)
    for key, value in eager.items():
        np.testing.assert_array_equal(replayed[key], value, err_msg=f"{name}: {key}")
