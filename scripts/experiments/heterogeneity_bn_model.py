"""A small residual network with BatchNormalization for 1x28x28 MNIST, for part (c) of
scripts/experiments/heterogeneity_experiment.py (`--model scripts/experiments/heterogeneity_bn_model.py`).

    conv 3x3 (8) - BN - ReLU - max pool 2x2                                  -> 8 x 14 x 14
    residual block: [conv 3x3 (8) - BN - ReLU - conv 3x3 (8) - BN] + identity, ReLU
    residual block: [conv 3x3 (16) stride 2 - BN - ReLU - conv 3x3 (16) - BN]
                    + [conv 1x1 (16) stride 2 - BN], ReLU                     -> 16 x 7 x 7
    global average pool - FC 10 (softmax)

Six BatchNormalization layers, about 6,000 parameters: BN statistics matter (a batch of a few samples
gives noisy ones), and a training epoch on 8,000 samples takes seconds on one core.
"""
from pydtnn.activations import Relu
from pydtnn.layers import FC, AdditionBlock, AveragePool2D, BatchNormalization, Conv2D, Flatten, Input, MaxPool2D


def conv_bn(filters, size, stride=1, relu=True):
    """Conv2D without bias (BN's shift replaces it), then BN, then optionally ReLU."""
    layers = [Conv2D(nfilters=filters, filter_shape=(size, size), stride=stride, padding=size // 2,
                     use_bias=False, weights_initializer="he_normal"),
              BatchNormalization()]
    return layers + [Relu()] if relu else layers


def residual(filters, stride=1, project=False):
    main = conv_bn(filters, 3, stride) + conv_bn(filters, 3, relu=False)
    shortcut = conv_bn(filters, 1, stride, relu=False) if project else []
    return [AdditionBlock(main, shortcut), Relu()]


def create_model(model):
    layers = [Input(shape=(1, 28, 28)), *conv_bn(8, 3), MaxPool2D(pool_shape=(2, 2), stride=2),
              *residual(8), *residual(16, stride=2, project=True),
              AveragePool2D(pool_shape=(0, 0)), Flatten(), FC(shape=(10,), activation="softmax")]
    for layer in layers:
        model.add(layer)
    return model
