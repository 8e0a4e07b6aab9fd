"""An AdditionBlock's last sum handed to the block before it (`pydtnn.execution.sum_handoff`): in a chain of
residual blocks, block k + 1's dx_shortcut + dx_main is summed in block k's ReLU-mask pass
(`relu_backward(dy, y, addend=...)`) instead of a pass of its own. The model's gradients and input gradient
are the same bits as with every block summing itself (IEEE addition is commutative), on the CPU backend and on
the GPU backend over the stand-in; a block's backward called outside the model's backward sums as before; the
gradients match finite differences; the kernels equal NumPy's (dy + a) * (y > 0).
"""
from __future__ import annotations

import numpy as np
import pytest

import gpu_standin
from pydtnn import Model
from pydtnn.activations import Relu
from pydtnn.backends import get_backend
from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input


def _residual(c):
    return AdditionBlock([Conv2D(nfilters=c, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu(),
                          Conv2D(nfilters=c, filter_shape=(3, 3), padding=1), BatchNormalization()], [])


def _model(backend, shape=(3, 6, 5)):
    model = Model(backend=backend, seed=0)
    model.add(Input(shape=shape))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(_residual(4))
    model.add(Relu())
    model.add(_residual(4))
    model.add(Relu())
    model.add(AdditionBlock([Conv2D(nfilters=6, filter_shape=(1, 1)), BatchNormalization()],       # a projection
                            [Conv2D(nfilters=6, filter_shape=(1, 1)), BatchNormalization()]))
    model.add(Relu())
    model.add(Flatten())
    model.add(FC(shape=(5,), activation="softmax"))
    return model


def _gradients(model, x, y, handoffs=True):
    """(every parameter's gradient, dL/dx) of one training pass; `handoffs=False`: every block sums itself."""
    model.params  # noqa: B018  (packing plans the passes)
    if not handoffs:
        model.execution = model.execution.without("handoffs")
    be = model.backend
    out = model.forward(be.asarray(x), training=True)
    dx = model.backward(out - be.asarray(y))
    return be.to_numpy(model.grads).copy(), be.to_numpy(dx)


def _backends():
    yield "cpu", lambda: get_backend("cpu", "float64", 0)
    with gpu_standin.active():
        from pydtnn.backends.gpu.backend import GPUBackend
        yield "gpu-standin", lambda: GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)


def test_a_chain_of_blocks_hands_its_sums_down():
    model = _model(get_backend("cpu", "float64", 0))
    model.params  # noqa: B018  (packing plans the passes)
    blocks = [l for l in model.layers if isinstance(l, AdditionBlock)]
    assert [(h.giver, h.taker) for h in model.execution.handoffs] == [(blocks[1], blocks[0]), (blocks[2], blocks[1])]
    partners = model.execution.partners
    assert partners(blocks[0]).get("sum_out") is None and partners(blocks[2]).get("sum_in") is None


@pytest.mark.parametrize("which", ["cpu", "gpu-standin"])
def test_handed_sums_give_the_same_bits_and_one_add_less_per_handoff(which):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, 3, 6, 5)), np.eye(5)[rng.integers(0, 5, 3)]
    for name, make in _backends():
        if name != which:
            continue
        adds = []
        handed, plain = _model(make()), _model(make())
        for model in (handed, plain):
            add = model.backend.add
            model.backend.add = lambda a, b, relu=False, _add=add, _m=model: adds.append(_m) or _add(a, b, relu)
        g1, dx1 = _gradients(handed, x, y)
        g2, dx2 = _gradients(plain, x, y, handoffs=False)
        np.testing.assert_array_equal(g1, g2)
        np.testing.assert_array_equal(dx1, dx2)
        backward_adds = [adds.count(m) - 3 for m in (handed, plain)]     # 3 merges in forward each
        assert backward_adds == [1, 3], backward_adds          # the projection block's own, and 2 handed on


def test_a_block_called_on_its_own_sums_itself():
    be = get_backend("cpu", "float64", 0)
    model = _model(be)
    rng = np.random.default_rng(3)
    model.forward(rng.standard_normal((2, 3, 6, 5)), training=True)
    block = model.layers[6]
    assert model.execution.partners(block).get("sum_out") is not None
    dy = be.to_internal(rng.standard_normal((2, 4, 6, 5)))       # the block's own layout (NHWC here)
    direct = block.backward(dy.copy())
    model.execution = model.execution.without("handoffs")
    np.testing.assert_array_equal(direct, block.backward(dy.copy()))


def test_handed_sums_vs_finite_differences():
    from gradcheck import assert_gradients
    model = _model(get_backend("cpu", "float64", 0), shape=(3, 4, 3))
    x = np.random.default_rng(1).standard_normal((3, 3, 4, 3))
    assert_gradients(model, x, tol=1e-5)
    assert len(model.execution.handoffs) == 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(4, 8, 4, 4), (3, 5)])      # packed (16-byte) and element by element
def test_relu_backward_of_two_parts_kernels(dtype, shape):
    rng = np.random.default_rng(4)
    dy, a, x = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    y = np.maximum(x, 0)
    want = (dy + a) * (y > 0)
    cpu = get_backend("cpu", dtype, 0)
    cpu._parallel_min = 0
    np.testing.assert_array_equal(cpu.relu_backward(dy, y, addend=a), want)
    with gpu_standin.active():
        from pydtnn.backends.gpu.backend import GPUBackend
        gpu = GPUBackend(dtype=dtype, seed=0, auto_conv_alg=False)
        got = gpu.relu_backward(gpu.asarray(dy), gpu.asarray(y), addend=gpu.asarray(a))
        np.testing.assert_array_equal(gpu.to_numpy(got), want)
