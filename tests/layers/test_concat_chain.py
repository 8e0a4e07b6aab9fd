"""Dense layers sharing one array per chain (pydtnn/execution/concat_chain.py): the same numbers as copying,
their gradients against finite differences, and the sharing itself."""
import numpy as np
import pytest

from gradcheck import assert_gradients
from pydtnn import Model
from pydtnn.activations import Relu
from pydtnn.backends import get_backend
from pydtnn.layers import FC, AveragePool2D, BatchNormalization, ConcatenationBlock, Conv2D, Flatten, Input
from pydtnn.execution.concat_chain import link_concat_chains


def dense_layer(growth):
    return ConcatenationBlock([BatchNormalization(), Relu(), Conv2D(nfilters=2 * growth, filter_shape=(1, 1)),
                               BatchNormalization(), Relu(), Conv2D(nfilters=growth, filter_shape=(3, 3),
                                                                    padding=1, use_bias=False)], [])


def small_densenet(dtype="float64", seed=0):
    """Two chains (3 and 2 dense layers) around a transition, as DenseNet is built."""
    model = Model("cpu", dtype, seed=seed)
    model.add(Input(shape=(3, 5, 6)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))
    for growth in (2, 3, 2):
        model.add(dense_layer(growth))
    for layer in (BatchNormalization(), Relu(), Conv2D(nfilters=5, filter_shape=(1, 1))):
        model.add(layer)
    for growth in (3, 2):
        model.add(dense_layer(growth))
    for layer in (BatchNormalization(), Relu(), AveragePool2D(pool_shape=(0, 0)), Flatten(), FC(shape=(3,))):
        model.add(layer)
    return model


def blocks(model):
    return [layer for layer in model.layers if type(layer) is ConcatenationBlock]


def unchain(model):
    model.execution = model.execution.without("chains")


def test_the_chains_and_their_room():
    model = small_densenet()
    chain = blocks(model)
    chains = link_concat_chains(model.layers)
    assert sum(len(c.blocks) - 1 for c in chains) == 3      # 2 links in the first chain, 1 in the second
    assert [r for c in chains for r in c.rooms] == [5, 2, 0, 2, 0]     # the new channels of the blocks after each one
    assert [c.blocks for c in chains] == [chain[:3], chain[3:]]


def test_the_model_lists_its_chains_and_what_they_hand_on():
    model = small_densenet()
    model.params  # noqa: B018      (packing plans the execution)
    chains, chain = model.execution.chains, blocks(model)
    assert [c.blocks for c in chains] == [chain[:3], chain[3:]] and [c.rooms for c in chains] == [[5, 2, 0], [2, 0]]
    partners = model.execution.partners
    assert all(partners(block)["chain"] is c for c in chains for block in c.blocks)
    first_bn = [block.paths[0][0] for block in chain]
    assert chains[0].hand_offs == [(first_bn[0], first_bn[1]), (first_bn[1], first_bn[2])]
    assert chains[1].hand_offs == [(first_bn[3], first_bn[4])]
    assert [partners(bn).get("moments") for bn in first_bn] == [None, chains[0], chains[0], None, chains[1]]
    assert "DenseChain(concatenation_block_3 -> concatenation_block_4; rooms [2, 0])" in repr(model.execution)


def test_only_the_declaring_classes_chain():
    """A ConcatenationBlock subclass, or a block whose first layer is a BatchNormalization subclass, inherits
    the computation but not the declaration: it copies, or sums every channel."""
    class Concatenation(ConcatenationBlock):
        pass

    class Normalization(BatchNormalization):
        pass

    model = Model("cpu", "float64", seed=0)
    for layer in (Input(shape=(3, 4, 4)), Concatenation([Conv2D(nfilters=2, filter_shape=(1, 1))], []),
                  ConcatenationBlock([Normalization(), Conv2D(nfilters=2, filter_shape=(1, 1))], []),
                  ConcatenationBlock([BatchNormalization(), Conv2D(nfilters=2, filter_shape=(1, 1))], []),
                  Flatten(), FC(shape=(2,))):
        model.add(layer)
    model.params  # noqa: B018
    [chain] = model.execution.chains
    assert (chain.blocks == model.layers[2:4] and model.execution.partners(model.layers[1]).get("chain") is None
            and chain.hand_offs == [])


def test_gradients_vs_finite_differences():
    model = small_densenet()
    x = np.random.default_rng(1).standard_normal((4, 3, 5, 6))
    assert_gradients(model, x)


def test_a_chain_writes_one_array_and_each_block_only_its_new_maps():
    model = small_densenet()
    outs = {}
    for block in blocks(model):
        merge = block.merge
        block.merge = lambda o, _m=merge, _b=block, **chain: outs.setdefault(_b.name, _m(o, **chain))
    model.forward(np.random.default_rng(2).standard_normal((2, 3, 5, 6)), training=True)
    first, second = [outs[b.name] for b in blocks(model)[:3]], [outs[b.name] for b in blocks(model)[3:]]
    for chain in (first, second):
        assert chain[-1].flags.c_contiguous                       # the last block's output is the whole array
        assert all(np.shares_memory(y, chain[-1]) for y in chain)
        assert not any(y.flags.c_contiguous for y in chain[:-1])  # the others are channel slices of it
    assert not np.shares_memory(first[-1], second[0])


def _run(x, chained, training, dy_seed):
    """A forward and backward of small_densenet, chained or copying: the channel counts each batch-moments
    pass summed, and (output, input gradient, first BatchNormalizations' running statistics, gradients)."""
    model = small_densenet(seed=7)
    model.forward(x, training=False)                            # builds and links
    if not chained:
        unchain(model)
    summed, moments = [], model.backend._bn_moments

    def spy(xf, ldx, m, c, *args):
        summed.append(c)
        return moments(xf, ldx, m, c, *args)
    model.backend._bn_moments = spy
    y = model.forward(x, training=training)
    dx = model.backward(np.random.default_rng(dy_seed).standard_normal(y.shape))
    stats = np.concatenate([np.concatenate([block.paths[0][0].mean, block.paths[0][0].var])
                            for block in blocks(model)])
    return summed, (y, dx, stats, model.grads.copy())


def _assert_runs_agree(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())


@pytest.mark.parametrize("training", [True, False])
def test_chained_equals_copying(training):
    """The chained and the copying run differ only in where roundings fall (an FMA, the order of the four
    terms BatchNormalization adds with the identity path's gradient): a few float64 ulps per operation over
    about twenty layers of O(1)-conditioned maps, far below 1e-12; a misplaced channel would be O(1)."""
    x = np.random.default_rng(3).standard_normal((4, 3, 5, 6))
    _assert_runs_agree(_run(x, True, training, 4)[1], _run(x, False, training, 4)[1])


def _bn_cases():
    rng = np.random.default_rng(5)
    full = rng.standard_normal((3, 4, 5, 11)) * 2 + 1
    return {"channel slice": full[..., 4:],                    # what a chain hands on: rows of 7, 11 apart
            "every other row": full[:, ::2, :, :7],             # rows not evenly spaced: copied
            "transposed": full[..., :7].transpose(0, 2, 1, 3),  # rows not evenly spaced: copied
            "contiguous": np.ascontiguousarray(full[..., :7])}


@pytest.mark.parametrize("case", list(_bn_cases()))
@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_reads_views_and_adds_the_addend(case, relu):
    """batchnorm_* on a strided view equal the same on its contiguous copy, and the addend (also a view)
    equals adding it afterwards, to the rounding of the order of a 4-term float64 sum."""
    be = get_backend("cpu", "float64")
    x = _bn_cases()[case]
    xc = np.ascontiguousarray(x)
    rng = np.random.default_rng(6)
    gamma, beta = rng.standard_normal(7), rng.standard_normal(7)
    y, mean, var, ctx = be.batchnorm_forward_train(x, gamma, beta, 1e-5, relu=relu)
    yc, mean_c, var_c, ctx_c = be.batchnorm_forward_train(xc, gamma, beta, 1e-5, relu=relu)
    for got, want in ((y, yc), (mean, mean_c), (var, var_c),
                      (be.batchnorm_forward_infer(x, gamma, beta, mean, var, 1e-5, relu=relu),
                       be.batchnorm_forward_infer(xc, gamma, beta, mean, var, 1e-5, relu=relu))):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    dy = rng.standard_normal(x.shape)
    addend = (rng.standard_normal(x.shape[:-1] + (9,)) * 3)[..., 2:]
    fused = {"relu_y": y} if relu else {}
    dx, dgamma, dbeta = be.batchnorm_backward(dy, ctx, addend=addend, **fused)
    dx_c, dgamma_c, dbeta_c = be.batchnorm_backward(dy, ctx_c, **{"relu_y": yc} if relu else {})
    np.testing.assert_allclose(dx, dx_c + addend, rtol=1e-13, atol=1e-13 * np.abs(addend).max())
    np.testing.assert_allclose(dgamma, dgamma_c, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dbeta, dbeta_c, rtol=1e-13, atol=1e-13)
    with pytest.raises(Exception, match="addend has shape"):
        be.batchnorm_backward(dy, ctx, addend=addend[:1])


def test_float32_chain_trains_like_copying():
    """float32, DenseNet's shapes in small: the two runs differ only in where roundings fall (as in the
    float64 test), a few float32 ulps (6e-8) per operation over about twenty layers, ~1e-6 of the largest
    gradient; gradients that cancel are compared against that largest one. 1e-4 leaves a 100x margin, and a
    misplaced channel would be O(1)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 3, 5, 6)).astype(np.float32)
    grads = []
    for chained in (True, False):
        model = small_densenet("float32", seed=9)
        model.forward(x, training=True)
        if not chained:
            unchain(model)
        y = model.forward(x, training=True)
        model.backward(np.ones_like(y))
        grads.append(model.grads.copy())
    scale = np.abs(grads[1]).max()
    np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-4 * scale)


def test_an_input_not_in_place_is_copied():
    """A block whose input is not the array its chain predecessor just returned concatenates by copying."""
    model = small_densenet()
    model.forward(np.zeros((2, 3, 5, 6)), training=True)
    first, second = blocks(model)[:2]
    rng = np.random.default_rng(10)
    first.forward(rng.standard_normal((2, 5, 6, 4)), training=True)      # leaves its room unclaimed
    x = rng.standard_normal((2, 5, 6, 6))                                # NHWC, as blocks see it
    y = second.forward(x, training=True)
    new = x
    for layer in second.paths[0]:
        new = layer.forward_internal(new, True)
    np.testing.assert_array_equal(y, np.concatenate([new, x], axis=3))


def test_a_subclass_whose_backward_takes_no_addend_gets_the_sum_from_the_block():
    class PlainBackwardBN(BatchNormalization):
        def backward(self, dy):
            return super().backward(dy)

    def layer():
        return ConcatenationBlock([PlainBackwardBN(), Conv2D(nfilters=2, filter_shape=(1, 1))], [])
    model = Model("cpu", "float64", seed=0)
    for lay in (Input(shape=(3, 4, 4)), layer(), layer(), Flatten(), FC(shape=(2,))):
        model.add(lay)
    assert_gradients(model, np.random.default_rng(11).standard_normal((3, 3, 4, 4)))


def test_known_moments_equal_summing_every_channel():
    """batchnorm_forward_train with the moments of x's last channels given sums only the others; per channel
    it is the same arithmetic (the same row parts and shift), so the results agree to a few float64 ulps of
    the sums; a moment put on the wrong channel would be O(1) off. Misuse is refused."""
    be = get_backend("cpu", "float64")
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((4, 5, 6, 13)) * 3 + 2)[..., 2:]       # 11 channels, a chain's slice
    gamma, beta = rng.standard_normal(11), rng.standard_normal(11)
    _, _, _, ctx_tail = be.batchnorm_forward_train(x[..., 4:], gamma[4:], beta[4:], 1e-5)
    known = be.batchnorm_moments(ctx_tail)
    y, mean, var, ctx = be.batchnorm_forward_train(x, gamma, beta, 1e-5)
    y_k, mean_k, var_k, ctx_k = be.batchnorm_forward_train(x, gamma, beta, 1e-5, known=known)
    for got, want in ((y_k, y), (mean_k, mean), (var_k, var), *zip(be.batchnorm_moments(ctx_k),
                                                                 be.batchnorm_moments(ctx))):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    dy = rng.standard_normal(x.shape)
    for got, want in zip(be.batchnorm_backward(dy, ctx_k), be.batchnorm_backward(dy, ctx)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="known moments of 11 of 11"):
        be.batchnorm_forward_train(x, gamma, beta, 1e-5, known=be.batchnorm_moments(ctx))
    with pytest.raises(ValueError, match="with sync"):
        be.batchnorm_forward_train(x, gamma, beta, 1e-5, known=known, sync=object(), center=mean)


def test_a_chain_sums_each_new_channel_once():
    """In training, each dense layer's first BatchNormalization sums only the channels its predecessor's
    did not (the chain hands the moments on): 4, then 2, then 3 channels in the first chain, against 4, 6,
    9 when copying. The outputs, running statistics and gradients agree as in test_chained_equals_copying."""
    x = np.random.default_rng(13).standard_normal((4, 3, 5, 6))
    (summed, got), (summed_copying, want) = _run(x, True, True, 14), _run(x, False, True, 14)
    # per dense layer: its first BatchNormalization, then the one after its 1x1 convolution (twice the
    # growth: 4, 6, 4 channels)
    assert summed[:6] == [4, 4, 2, 6, 3, 4] and summed_copying[:6] == [4, 4, 6, 6, 9, 4]
    _assert_runs_agree(got, want)
