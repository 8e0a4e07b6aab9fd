"""Densely connected networks (Huang et al. 2017), DenseNet-BC.

A dense layer is ConcatenationBlock([BN, ReLU, Conv 1x1 (4k), BN, ReLU, Conv 3x3 (k)], []): its k new
feature maps are concatenated to its input (new maps first). A transition is BN, ReLU, Conv 1x1 halving
the channels, AvgPool 2x2/2. After the last dense block: BN, ReLU, global average pooling, classifier.
Convolutions are bias-free (He-normal).

| name        | growth k | stem filters | layers per block |
| densenet121 | 32       | 64           | 6, 12, 24, 16    |
| densenet161 | 48       | 96           | 6, 12, 36, 24    |
| densenet169 | 32       | 64           | 6, 12, 32, 32    |
| densenet201 | 32       | 64           | 6, 12, 48, 32    |

*_imagenet (3x224x224): 7x7 stride-2 stem convolution, BN, ReLU, 3x3 stride-2 max pooling; with 1000 classes
DenseNet-121 has 7,978,856 parameters, 161 28,681,000, 169 14,149,480, 201 20,013,928.
*_cifar10 (3x32x32): a 3x3 stride-1 stem convolution and no pooling; the transitions still halve 32 -> 4.
"""
from pydtnn.activations import Relu
from pydtnn.layers import AveragePool2D, BatchNormalization, ConcatenationBlock, Conv2D, Flatten, MaxPool2D

from ._common import add_all, add_classifier, add_input, conv_bn, zoo

_CONFIGS = {121: (32, 64, (6, 12, 24, 16)), 161: (48, 96, (6, 12, 36, 24)),
            169: (32, 64, (6, 12, 32, 32)), 201: (32, 64, (6, 12, 48, 32))}


def _bn_relu_conv(nfilters, size, padding=0):
    return [BatchNormalization(), Relu(),
            Conv2D(nfilters=nfilters, filter_shape=(size, size), padding=padding, use_bias=False,
                   weights_initializer="he_normal")]


def dense_layer(growth, bn_size=4):
    return ConcatenationBlock(_bn_relu_conv(bn_size * growth, 1) + _bn_relu_conv(growth, 3, padding=1), [])


def transition(out_channels):
    return _bn_relu_conv(out_channels, 1) + [AveragePool2D(pool_shape=(2, 2), stride=2)]


def _densenet(model, input_shape, nclasses, depth, imagenet_stem):
    growth, channels, blocks = _CONFIGS[depth]
    add_input(model, input_shape)
    if imagenet_stem:
        add_all(model, conv_bn(channels, 7, stride=2, padding=3))
        model.add(MaxPool2D(pool_shape=(3, 3), stride=2, padding=1))
    else:
        model.add(Conv2D(nfilters=channels, filter_shape=(3, 3), padding=1, use_bias=False,
                         weights_initializer="he_normal"))
    for i, nlayers in enumerate(blocks):
        for _ in range(nlayers):
            model.add(dense_layer(growth))
        channels += nlayers * growth
        if i < len(blocks) - 1:
            channels //= 2
            add_all(model, transition(channels))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(AveragePool2D(pool_shape=(0, 0)))
    model.add(Flatten())
    add_classifier(model, nclasses)


@zoo("cifar10")
def densenet121_cifar10(model, nclasses=10, input_shape=None):
    """DenseNet-121 with a 3x3 stem, for 32x32 inputs."""
    _densenet(model, input_shape, nclasses, 121, imagenet_stem=False)


@zoo("cifar10")
def densenet161_cifar10(model, nclasses=10, input_shape=None):
    """DenseNet-161 with a 3x3 stem, for 32x32 inputs."""
    _densenet(model, input_shape, nclasses, 161, imagenet_stem=False)


@zoo("cifar10")
def densenet169_cifar10(model, nclasses=10, input_shape=None):
    """DenseNet-169 with a 3x3 stem, for 32x32 inputs."""
    _densenet(model, input_shape, nclasses, 169, imagenet_stem=False)


@zoo("cifar10")
def densenet201_cifar10(model, nclasses=10, input_shape=None):
    """DenseNet-201 with a 3x3 stem, for 32x32 inputs."""
    _densenet(model, input_shape, nclasses, 201, imagenet_stem=False)


@zoo("imagenet")
def densenet121_imagenet(model, nclasses=1000, input_shape=None):
    """DenseNet-121 for 224x224 ImageNet crops."""
    _densenet(model, input_shape, nclasses, 121, imagenet_stem=True)


@zoo("imagenet")
def densenet161_imagenet(model, nclasses=1000, input_shape=None):
    """DenseNet-161 for 224x224 ImageNet crops."""
    _densenet(model, input_shape, nclasses, 161, imagenet_stem=True)


@zoo("imagenet")
def densenet169_imagenet(model, nclasses=1000, input_shape=None):
    """DenseNet-169 for 224x224 ImageNet crops."""
    _densenet(model, input_shape, nclasses, 169, imagenet_stem=True)


@zoo("imagenet")
def densenet201_imagenet(model, nclasses=1000, input_shape=None):
    """DenseNet-201 for 224x224 ImageNet crops."""
    _densenet(model, input_shape, nclasses, 201, imagenet_stem=True)
