"""MobileNet v1 (Howard et al. 2017), width multiplier 1, for CIFAR-10.

A 3x3 convolution with 32 filters (stride 1 for 32x32 inputs, where ImageNet's uses 2), then 13 depthwise
separable layers, each Conv2D(grouping="depthwise") 3x3 + BN + ReLU followed by
Conv2D(grouping="pointwise") 1x1 + BN + ReLU; strides 2 at 128, 256, 512 and the first 1024
(32 -> 2), global average pooling, classifier. Convolutions are bias-free (He-normal).
"""
from pydtnn.activations import Relu
from pydtnn.layers import AveragePool2D, BatchNormalization, Conv2D, Flatten

from ._common import add_all, add_classifier, add_input, conv_bn, zoo

# (pointwise filters, depthwise stride)
LAYERS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
          (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


def separable(nfilters, stride):
    return [Conv2D(filter_shape=(3, 3), stride=stride, padding=1, grouping="depthwise", use_bias=False,
                   weights_initializer="he_normal"), BatchNormalization(), Relu(),
            Conv2D(nfilters=nfilters, grouping="pointwise", use_bias=False, weights_initializer="he_normal"),
            BatchNormalization(), Relu()]


@zoo("cifar10")
def mobilenetv1_cifar10(model, nclasses=10, input_shape=None):
    """MobileNet v1 for 32x32 inputs."""
    add_input(model, input_shape)
    add_all(model, conv_bn(32, 3, padding=1))
    for nfilters, stride in LAYERS:
        add_all(model, separable(nfilters, stride))
    model.add(AveragePool2D(pool_shape=(0, 0)))
    model.add(Flatten())
    add_classifier(model, nclasses)
