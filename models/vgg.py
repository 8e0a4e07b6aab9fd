"""VGG (Simonyan & Zisserman 2014): configurations A (VGG-11), D (VGG-16) and E (VGG-19).

3x3 'same' convolutions with bias and ReLU (He-normal), 2x2 max pooling after each stage.
- *_imagenet (3x224x224): Flatten -> FC 4096 ReLU -> Dropout 0.5 -> FC 4096 ReLU -> Dropout 0.5 -> FC.
  With 1000 classes: VGG-11 132,863,336, VGG-16 138,357,544, VGG-19 143,667,240 parameters (the published
  counts). With another input size the first FC takes whatever the features flatten to (512 * (H/32)^2).
- *_cifar10 (3x32x32): the same features (1x1x512 after the five pools), then FC 512 ReLU -> Dropout 0.5
  -> FC 512 ReLU -> Dropout 0.5 -> FC; the *bn* variants put BatchNormalization between each
  convolution (then without bias) and its ReLU.
"""
from pydtnn.activations import Relu
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, MaxPool2D

from ._common import add_classifier, add_input, zoo

# filters per convolution, "M" = 2x2 max pooling
CONFIGS = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def _features(model, depth, batchnorm):
    for item in CONFIGS[depth]:
        if item == "M":
            model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
        elif batchnorm:
            model.add(Conv2D(nfilters=item, filter_shape=(3, 3), padding=1, use_bias=False,
                             weights_initializer="he_normal"))
            model.add(BatchNormalization())
            model.add(Relu())
        else:
            model.add(Conv2D(nfilters=item, filter_shape=(3, 3), padding=1, activation="relu",
                             weights_initializer="he_normal"))


def _classifier(model, hidden, nclasses):
    model.add(Flatten())
    for _ in range(2):
        model.add(FC(shape=(hidden,), activation="relu", weights_initializer="he_normal"))
        model.add(Dropout(0.5))
    add_classifier(model, nclasses)


def _vgg(model, input_shape, nclasses, depth, batchnorm, hidden):
    add_input(model, input_shape)
    _features(model, depth, batchnorm)
    _classifier(model, hidden, nclasses)


@zoo("cifar10")
def vgg11_cifar10(model, nclasses=10, input_shape=None):
    """VGG-11 features + FC 512 - 512 head, for 32x32 inputs."""
    _vgg(model, input_shape, nclasses, 11, False, 512)


@zoo("cifar10")
def vgg11bn_cifar10(model, nclasses=10, input_shape=None):
    """VGG-11 with BatchNormalization, for 32x32 inputs."""
    _vgg(model, input_shape, nclasses, 11, True, 512)


@zoo("cifar10")
def vgg16_cifar10(model, nclasses=10, input_shape=None):
    """VGG-16 features + FC 512 - 512 head, for 32x32 inputs."""
    _vgg(model, input_shape, nclasses, 16, False, 512)


@zoo("cifar10")
def vgg16bn_cifar10(model, nclasses=10, input_shape=None):
    """VGG-16 with BatchNormalization, for 32x32 inputs."""
    _vgg(model, input_shape, nclasses, 16, True, 512)


@zoo("imagenet")
def vgg11_imagenet(model, nclasses=1000, input_shape=None):
    """VGG-11 (configuration A) for 224x224 ImageNet crops."""
    _vgg(model, input_shape, nclasses, 11, False, 4096)


@zoo("imagenet")
def vgg16_imagenet(model, nclasses=1000, input_shape=None):
    """VGG-16 (configuration D) for 224x224 ImageNet crops."""
    _vgg(model, input_shape, nclasses, 16, False, 4096)


@zoo("imagenet")
def vgg19_imagenet(model, nclasses=1000, input_shape=None):
    """VGG-19 (configuration E) for 224x224 ImageNet crops."""
    _vgg(model, input_shape, nclasses, 19, False, 4096)
