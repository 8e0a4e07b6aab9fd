"""Fused BatchNormalization + Relu on the CPU backend: the model keeps both layers, execution runs them in
one pass; results equal the unfused layers' (float64) in training, inference and a frozen BN's backward,
gradients match finite differences, and the synchronized BatchNorm hook fuses too."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.activations import Relu
from pydtnn.backends import get_backend
from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input, Layer
from pydtnn.models import build_model
from paths import sibling
_reduced = sibling("parallel", "test_sync_batchnorm")._reduced


def _model(fuse, dtype="float64"):
    be = get_backend("cpu", dtype, 0)
    be.fuses_relu = fuse                 # an instance attribute: this model's backend only
    model = Model(backend=be, seed=0)
    model.add(Input(shape=(3, 7, 6)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu()], []))
    model.add(Relu())                        # fused into the block's merge
    model.add(BatchNormalization())          # followed by Flatten: not fused
    model.add(Flatten())
    model.add(FC(shape=(5,), activation="softmax"))
    return model


def _fused_relu(model, layer):
    """The FusedRelu the model's plan pairs `layer` with (None: it runs on its own)."""
    return model.execution.partners(layer).get("relu")


def test_pairs_are_found_and_the_model_keeps_both_layers():
    fused, plain = _model(True), _model(False)
    fused.params, plain.params  # noqa: B018  (packing links the pairs)
    bns = [l for l in fused.all_layers() if isinstance(l, BatchNormalization)]
    assert [type(_fused_relu(fused, b).relu).__name__ if _fused_relu(fused, b) else None
            for b in bns] == ["Relu", "Relu", None]
    assert all(_fused_relu(plain, l) is None for l in plain.all_layers()
               if isinstance(l, (BatchNormalization, AdditionBlock)))
    assert isinstance(fused.layers[4], AdditionBlock) and _fused_relu(fused, fused.layers[4]).relu is fused.layers[5]
    assert fused.summary() == plain.summary() and "relu" in fused.summary()
    resnet = Model(backend="cpu", seed=0)
    build_model("resnet20_cifar10", resnet)
    resnet.params  # noqa: B018
    fused_in_resnet = [l for l in resnet.all_layers() if _fused_relu(resnet, l) is not None]
    assert sum(isinstance(l, BatchNormalization) for l in fused_in_resnet) == 10
    assert sum(isinstance(l, AdditionBlock) for l in fused_in_resnet) == 9


def test_the_model_lists_its_fused_pairs_and_a_repack_wires_anew():
    model = _model(True)
    model.params  # noqa: B018
    pairs = model.execution.fused_relus
    assert [(p.producer.name, p.relu.name) for p in pairs] == [
        ("batch_normalization", "relu"), ("batch_normalization_1", "relu_1"), ("addition_block", "relu_2")]
    assert all(_fused_relu(model, p.producer) is p and _fused_relu(model, p.relu) is p for p in pairs)
    assert model.execution.chains == [] and "FusedRelu(addition_block + relu_2)" in repr(model.execution)
    model.forward(np.zeros((2, 3, 7, 6)), training=True)
    alone = pairs[0].relu.forward(-np.ones((2, 7, 6, 4)))      # a Relu run on its own after its pair ran computes
    assert not pairs[0].passed_on and (alone == 0).all()

    model = Model(backend=get_backend("cpu", "float64", 0), seed=0)
    for layer in (Input(shape=(3, 4, 4)), BatchNormalization()):
        model.add(layer)
    model.params  # noqa: B018
    assert model.execution.fused_relus == []
    relu = model.add(Relu())
    model.params  # noqa: B018      (an add repacks: the model is planned anew)
    bn = model.layers[1]
    assert [(p.producer, p.relu) for p in model.execution.fused_relus] == [(bn, relu)]
    model.backend.fuses_relu = False
    model.add(Flatten())
    model.params  # noqa: B018      (the old plan's pairs are gone)
    assert model.execution.fused_relus == [] and _fused_relu(model, bn) is None and _fused_relu(model, relu) is None


class _Shift(Layer):
    """y = x + 1, which declares that a Relu after it may run inside it (what docs/custom_layers.md shows)."""
    internal_layout = True

    def fuses_next_relu(self):
        return True

    def forward(self, x, training=False, relu=None):
        y = x + 1
        if relu is None:
            return y
        return relu.hand_on(self.backend.relu_forward(y))

    def backward(self, dy, relu=None):
        if relu is not None:                    # the Relu passed dy on: its mask first
            dy = self.backend.relu_backward(dy, relu.y)
        return dy


class _ShiftSubclass(_Shift):
    """Inherits the computation, not the declaration: runs unfused."""


def test_declarations_are_opt_in_and_not_inherited():
    def model(shift, bn_class):
        m = Model(backend="cpu", dtype="float64", seed=0)
        for layer in (Input(shape=(2, 3, 3)), shift, Relu(), bn_class(), Relu(), Flatten(), FC(shape=(2,))):
            m.add(layer)
        return m

    class PlainBN(BatchNormalization):
        pass

    class FusingBN(BatchNormalization):
        fuses_next_relu = BatchNormalization.fuses_next_relu

    x = np.random.default_rng(2).standard_normal((3, 2, 3, 3))
    runs = []
    for shift, bn_class, fused in ((_Shift(), FusingBN, True), (_ShiftSubclass(), PlainBN, False)):
        m = model(shift, bn_class)
        y = m.forward(x, training=True)
        runs.append((y, m.backward(np.ones_like(y)), m.grads.copy()))
        assert [p.producer for p in m.execution.fused_relus] == ([m.layers[1], m.layers[3]] if fused else [])
        assert all(_fused_relu(m, p.relu).passed_on for p in m.execution.fused_relus)
    for got, want in zip(*runs):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_fused_equals_unfused_in_training_inference_and_backward():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 7, 6))
    y = np.eye(5)[rng.integers(0, 5, 5)]
    fused, plain = _model(True), _model(False)
    for training in (True, False):
        outs = [m.forward(x, training=training) for m in (fused, plain)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12, atol=1e-13)
        dxs = [m.backward(np.ones_like(outs[0])) for m in (fused, plain)]   # inference: frozen BN backward
        np.testing.assert_allclose(dxs[0], dxs[1], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(fused.grads, plain.grads, rtol=1e-11, atol=1e-12)
    for m in (fused, plain):
        m.compute_gradients(x, y, "categorical_cross_entropy")
    np.testing.assert_allclose(fused.grads, plain.grads, rtol=1e-11, atol=1e-12)
    relus = [l for l in fused.all_layers() if isinstance(l, Relu)]
    assert all(_fused_relu(fused, relu).passed_on for relu in relus[:3])     # the fused paths ran


def test_fused_gradients_vs_finite_differences():
    # (the larger model above has activations within finite-difference reach of the ReLU's kink, fused or not)
    from gradcheck import assert_gradients
    model = Model(backend="cpu", dtype="float64", seed=0)
    model.add(Input(shape=(3, 5, 4)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(Flatten())
    model.add(FC(shape=(3,)))
    x = np.random.default_rng(1).standard_normal((4, 3, 5, 4))
    assert_gradients(model, x, tol=1e-5)
    assert _fused_relu(model, model.layers[2]).relu is model.layers[3] and _fused_relu(model, model.layers[3]).passed_on


def test_fused_relu_keeps_nan():
    be = get_backend("cpu", "float32", 0)
    x = np.full((2, 3, 3, 4), np.nan, np.float32)
    y, *_ = be.batchnorm_forward_train(x, np.ones(4), np.zeros(4), 1e-5, relu=True)
    assert np.isnan(y).all() and np.isnan(be.relu_forward(x)).all()


def test_synced_fused_batchnorm_equals_the_whole_batch():
    be = get_backend("cpu", "float64", 0)
    rng = np.random.default_rng(3)
    x = rng.normal(0.3, 1.7, (17, 5, 4, 3))
    dy = rng.normal(size=x.shape)
    gamma, beta, center = rng.normal(size=3), rng.normal(size=3), rng.normal(size=3)
    cuts = [0, 4, 13, 17]

    part = lambda a, r: a[cuts[r]:cuts[r + 1]]
    fwd = _reduced(lambda r, sync: be.batchnorm_forward_train(part(x, r), gamma, beta, 1e-5, sync=sync,
                                                               center=center, relu=True), 3)
    bwd = _reduced(lambda r, sync: be.batchnorm_backward(part(dy, r), fwd[r][3], sync=sync, relu_y=fwd[r][0]), 3)
    got = [(f[0], b[0]) for f, b in zip(fwd, bwd)]
    y, _, _, ctx = be.batchnorm_forward_train(x, gamma, beta, 1e-5)
    want_y = np.maximum(y, 0)
    want_dx, _, _ = be.batchnorm_backward(dy * (want_y > 0), ctx)
    np.testing.assert_allclose(np.concatenate([g[0] for g in got]), want_y, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([g[1] for g in got]), want_dx, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("shape", [(64, 8, 8, 16), (3, 5)])
def test_relu_and_add_kernels_match_numpy(shape):
    be = get_backend("cpu", "float32", 0)
    be._parallel_min = 0
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    y = be.relu_forward(x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(be.relu_backward(dy, y), dy * (y > 0))
    np.testing.assert_array_equal(be.add(x, dy), x + dy)
    np.testing.assert_array_equal(be.add(x, dy, relu=True), np.maximum(x + dy, 0))
