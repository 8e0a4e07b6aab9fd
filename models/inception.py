"""Inception v3 (Szegedy et al. 2015) for 3x299x299 inputs, laid out as torchvision's Inception3 without the
auxiliary classifier (upstream PyDTNN's file for it is broken).

Every convolution is bias-free and followed by BatchNormalization and ReLU. Modules are
ConcatenationBlocks; the 1x3 / 3x1 split of module E nests a ConcatenationBlock inside a path.
Stem (299 -> 35), 3 x module A (35x35), B (-> 17), 4 x module C (17x17), D (-> 8), 2 x module E, global
average pooling, Dropout 0.5, classifier: 23,834,568 parameters with 1000 classes (torchvision's 27,161,264
minus its auxiliary classifier's 3,326,696). The smallest input it accepts is 75x75.
"""
from pydtnn.layers import AveragePool2D, ConcatenationBlock, Dropout, Flatten, MaxPool2D

from ._common import add_all, add_classifier, add_input, conv_bn, zoo


def _avg3():
    return AveragePool2D(pool_shape=(3, 3), stride=1, padding=1)


def module_a(pool_features):
    return ConcatenationBlock(
        conv_bn(64, 1),
        conv_bn(48, 1) + conv_bn(64, 5, padding=2),
        conv_bn(64, 1) + conv_bn(96, 3, padding=1) + conv_bn(96, 3, padding=1),
        [_avg3()] + conv_bn(pool_features, 1),
    )


def module_b():
    return ConcatenationBlock(
        conv_bn(384, 3, stride=2),
        conv_bn(64, 1) + conv_bn(96, 3, padding=1) + conv_bn(96, 3, stride=2),
        [MaxPool2D(pool_shape=(3, 3), stride=2)],
    )


def module_c(c7):
    return ConcatenationBlock(
        conv_bn(192, 1),
        conv_bn(c7, 1) + conv_bn(c7, (1, 7), padding=(0, 3)) + conv_bn(192, (7, 1), padding=(3, 0)),
        conv_bn(c7, 1) + conv_bn(c7, (7, 1), padding=(3, 0)) + conv_bn(c7, (1, 7), padding=(0, 3))
        + conv_bn(c7, (7, 1), padding=(3, 0)) + conv_bn(192, (1, 7), padding=(0, 3)),
        [_avg3()] + conv_bn(192, 1),
    )


def module_d():
    return ConcatenationBlock(
        conv_bn(192, 1) + conv_bn(320, 3, stride=2),
        conv_bn(192, 1) + conv_bn(192, (1, 7), padding=(0, 3)) + conv_bn(192, (7, 1), padding=(3, 0))
        + conv_bn(192, 3, stride=2),
        [MaxPool2D(pool_shape=(3, 3), stride=2)],
    )


def _split_1x3_3x1(n):
    return ConcatenationBlock(conv_bn(n, (1, 3), padding=(0, 1)), conv_bn(n, (3, 1), padding=(1, 0)))


def module_e():
    return ConcatenationBlock(
        conv_bn(320, 1),
        conv_bn(384, 1) + [_split_1x3_3x1(384)],
        conv_bn(448, 1) + conv_bn(384, 3, padding=1) + [_split_1x3_3x1(384)],
        [_avg3()] + conv_bn(192, 1),
    )


@zoo("imagenet", input_shape=(3, 299, 299))
def inceptionv3_imagenet(model, nclasses=1000, input_shape=None):
    """Inception v3 for 299x299 ImageNet crops."""
    add_input(model, input_shape)
    add_all(model, conv_bn(32, 3, stride=2))
    add_all(model, conv_bn(32, 3))
    add_all(model, conv_bn(64, 3, padding=1))
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2))
    add_all(model, conv_bn(80, 1))
    add_all(model, conv_bn(192, 3))
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2))
    for pool_features in (32, 64, 64):
        model.add(module_a(pool_features))
    model.add(module_b())
    for c7 in (128, 160, 160, 192):
        model.add(module_c(c7))
    model.add(module_d())
    model.add(module_e())
    model.add(module_e())
    model.add(AveragePool2D(pool_shape=(0, 0)))
    model.add(Flatten())
    model.add(Dropout(0.5))
    add_classifier(model, nclasses)
