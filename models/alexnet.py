"""AlexNet.

- alexnet_imagenet (3x227x227): the single-tower AlexNet (Krizhevsky 2012 / "One weird trick" layout):
  Conv 96 11x11/4, MaxPool 3/2, Conv 256 5x5, MaxPool 3/2, Conv 384, 384, 256 3x3, MaxPool 3/2,
  FC 4096, Dropout 0.5, FC 4096, Dropout 0.5, FC nclasses (62,378,344 parameters with 1000 classes).
  The smallest input it accepts is 67x67; the first FC takes whatever the features flatten to.
- alexnet_cifar10 (3x32x32): the usual CIFAR adaptation: Conv 64 3x3/2, MaxPool 2, Conv 192, MaxPool 2,
  Conv 384, 256, 256, MaxPool 2, Dropout 0.5, FC 4096, Dropout 0.5, FC 4096, FC nclasses.
"""
from pydtnn.layers import FC, Conv2D, Dropout, Flatten, MaxPool2D

from ._common import add_classifier, add_input, zoo


def _conv(nfilters, size, stride=1, padding=0):
    return Conv2D(nfilters=nfilters, filter_shape=(size, size), stride=stride, padding=padding, activation="relu",
                  weights_initializer="he_uniform")


def _fc(n):
    return FC(shape=(n,), activation="relu", weights_initializer="he_uniform")


@zoo("imagenet", input_shape=(3, 227, 227))
def alexnet_imagenet(model, nclasses=1000, input_shape=None):
    """Single-tower AlexNet for 227x227 ImageNet crops."""
    add_input(model, input_shape)
    model.add(_conv(96, 11, stride=4))
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2))
    model.add(_conv(256, 5, padding=2))
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2))
    model.add(_conv(384, 3, padding=1))
    model.add(_conv(384, 3, padding=1))
    model.add(_conv(256, 3, padding=1))
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2))
    model.add(Flatten())
    model.add(_fc(4096))
    model.add(Dropout(0.5))
    model.add(_fc(4096))
    model.add(Dropout(0.5))
    add_classifier(model, nclasses)


@zoo("cifar10")
def alexnet_cifar10(model, nclasses=10, input_shape=None):
    """AlexNet adapted to 32x32 inputs (3x3 filters, 2x2 pools)."""
    add_input(model, input_shape)
    model.add(_conv(64, 3, stride=2, padding=1))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(_conv(192, 3, padding=1))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(_conv(384, 3, padding=1))
    model.add(_conv(256, 3, padding=1))
    model.add(_conv(256, 3, padding=1))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(Flatten())
    model.add(Dropout(0.5))
    model.add(_fc(4096))
    model.add(Dropout(0.5))
    model.add(_fc(4096))
    add_classifier(model, nclasses)
