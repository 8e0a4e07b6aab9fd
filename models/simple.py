"""Toy models for MNIST (1x28x28): a multilayer perceptron and a small CNN."""
from pydtnn.layers import FC, Conv2D, Flatten, MaxPool2D

from ._common import add_classifier, add_input, zoo


@zoo("mnist")
def simplemlp(model, nclasses=10, input_shape=None):
    """Flatten -> FC 512 ReLU -> FC 512 ReLU -> FC nclasses (about 0.67 M parameters on MNIST)."""
    add_input(model, input_shape)
    model.add(Flatten())
    model.add(FC(shape=(512,), activation="relu", weights_initializer="he_uniform"))
    model.add(FC(shape=(512,), activation="relu", weights_initializer="he_uniform"))
    add_classifier(model, nclasses)


@zoo("mnist")
def simplecnn(model, nclasses=10, input_shape=None):
    """Conv 3x3x4 ReLU -> MaxPool 2x2 -> FC 128 ReLU -> FC nclasses (upstream's default model)."""
    add_input(model, input_shape)
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, stride=1, activation="relu",
                     weights_initializer="he_uniform"))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(Flatten())
    model.add(FC(shape=(128,), activation="relu", weights_initializer="he_uniform"))
    add_classifier(model, nclasses)
