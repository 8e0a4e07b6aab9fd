"""GoogLeNet / Inception v1 (Szegedy et al. 2014), with BatchNormalization after every convolution.

An inception module is a ConcatenationBlock of 4 paths over the same input:
1x1 conv | 1x1 reduce -> 3x3 conv | 1x1 reduce -> 5x5 conv | 3x3 stride-1 max pool -> 1x1 projection.
Convolutions are bias-free, each followed by BN and ReLU (as torchvision's GoogLeNet, but with true 5x5
filters as in the paper). No auxiliary classifiers.

- googlenet_imagenet (3x224x224): stem 7x7/2 conv 64, max pool 3/2, 1x1 conv 64, 3x3 conv 192, max pool 3/2,
  inception 3a 3b, pool, 4a-4e, pool, 5a 5b, global average pooling, Dropout 0.4, classifier.
- googlenet_cifar10 (3x32x32): a 3x3 conv 192 stem and no early pooling (the common CIFAR adaptation),
  then the same modules (pools after 3b and 4e), global average pooling, classifier.
"""
from pydtnn.layers import ConcatenationBlock, Dropout, Flatten, MaxPool2D, AveragePool2D

from ._common import add_all, add_classifier, add_input, conv_bn, zoo

# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) of the paper's table 1
MODULES = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64), "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64), "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
}


def inception(n1, n3r, n3, n5r, n5, npool):
    return ConcatenationBlock(
        conv_bn(n1, 1),
        conv_bn(n3r, 1) + conv_bn(n3, 3, padding=1),
        conv_bn(n5r, 1) + conv_bn(n5, 5, padding=2),
        [MaxPool2D(pool_shape=(3, 3), stride=1, padding=1)] + conv_bn(npool, 1),
    )


def _pool():
    return MaxPool2D(pool_shape=(3, 3), stride=2, padding=1)


def _body(model, nclasses, dropout):
    for name in ("3a", "3b"):
        model.add(inception(*MODULES[name]))
    model.add(_pool())
    for name in ("4a", "4b", "4c", "4d", "4e"):
        model.add(inception(*MODULES[name]))
    model.add(_pool())
    for name in ("5a", "5b"):
        model.add(inception(*MODULES[name]))
    model.add(AveragePool2D(pool_shape=(0, 0)))
    model.add(Flatten())
    if dropout:
        model.add(Dropout(dropout))
    add_classifier(model, nclasses)


@zoo("imagenet")
def googlenet_imagenet(model, nclasses=1000, input_shape=None):
    """GoogLeNet for 224x224 ImageNet crops."""
    add_input(model, input_shape)
    add_all(model, conv_bn(64, 7, stride=2, padding=3))
    model.add(_pool())
    add_all(model, conv_bn(64, 1))
    add_all(model, conv_bn(192, 3, padding=1))
    model.add(_pool())
    _body(model, nclasses, dropout=0.4)


@zoo("cifar10")
def googlenet_cifar10(model, nclasses=10, input_shape=None):
    """GoogLeNet adapted to 32x32 inputs (3x3 stem, no early pooling)."""
    add_input(model, input_shape)
    add_all(model, conv_bn(192, 3, padding=1))
    _body(model, nclasses, dropout=0.0)
