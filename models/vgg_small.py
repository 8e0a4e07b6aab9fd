"""Small VGG-like CIFAR-10 networks: the "VGG-1/2/3 blocks" baselines of the classic Keras tutorial.

A block is two 3x3 'same' convolutions (32, 64, 128 filters for blocks 1, 2, 3; ReLU, He-uniform) and a
2x2 max pooling; the head is FC 128 ReLU and the classifier.
- vgg1, vgg2, vgg3: one, two, three blocks (vgg3: 550,570 parameters on CIFAR-10).
- vgg3do: Dropout(0.2) after every block and after FC 128.
- vgg3do2: increasing dropout, 0.2 / 0.3 / 0.4 after the blocks and 0.5 after FC 128.
- vgg3dobn: vgg3do2 with BatchNormalization after every convolution and after FC 128 (after the ReLU,
  as in the tutorial).
"""
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, MaxPool2D

from ._common import add_classifier, add_input, zoo

_FILTERS = (32, 64, 128)


def _vgg_blocks(model, input_shape, nclasses, nblocks, dropouts=None, batchnorm=False):
    add_input(model, input_shape)
    for b in range(nblocks):
        for _ in range(2):
            model.add(Conv2D(nfilters=_FILTERS[b], filter_shape=(3, 3), padding="same", activation="relu",
                             weights_initializer="he_uniform"))
            if batchnorm:
                model.add(BatchNormalization())
        model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
        if dropouts:
            model.add(Dropout(dropouts[b]))
    model.add(Flatten())
    model.add(FC(shape=(128,), activation="relu", weights_initializer="he_uniform"))
    if batchnorm:
        model.add(BatchNormalization())
    if dropouts:
        model.add(Dropout(dropouts[-1]))
    add_classifier(model, nclasses)


@zoo("cifar10")
def vgg1(model, nclasses=10, input_shape=None):
    """One VGG block (32 filters) + FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 1)


@zoo("cifar10")
def vgg2(model, nclasses=10, input_shape=None):
    """Two VGG blocks (32, 64 filters) + FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 2)


@zoo("cifar10")
def vgg3(model, nclasses=10, input_shape=None):
    """Three VGG blocks (32, 64, 128 filters) + FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 3)


@zoo("cifar10")
def vgg3do(model, nclasses=10, input_shape=None):
    """vgg3 with Dropout(0.2) after every block and after FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 3, dropouts=(0.2, 0.2, 0.2, 0.2))


@zoo("cifar10")
def vgg3do2(model, nclasses=10, input_shape=None):
    """vgg3 with increasing dropout: 0.2, 0.3, 0.4 after the blocks, 0.5 after FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 3, dropouts=(0.2, 0.3, 0.4, 0.5))


@zoo("cifar10")
def vgg3dobn(model, nclasses=10, input_shape=None):
    """vgg3do2 with BatchNormalization after every convolution and after FC 128."""
    _vgg_blocks(model, input_shape, nclasses, 3, dropouts=(0.2, 0.3, 0.4, 0.5), batchnorm=True)
